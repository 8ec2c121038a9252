use kiln::*;
fn main() {
    let x = Tensor::arange(0.0, 6.0, 1.0).reshape(&[2, 3]);
    let y = (&x * 2.0 + 1.0).sum(&[1], false);
    println!("{}", y.dump_graph());
    let p = y.plan(&RealizeOptions::default()).unwrap();
    println!("{}", p.dump_text());
    println!("{:?}", y.to_vec::<f32>());
    let r = kiln::reference::evaluate(&y).unwrap();
    println!("{:?}", r.to_f64());
    let s = Tensor::randn(&[4, 8], 1).softmax(-1);
    println!(
        "{}",
        s.plan(&RealizeOptions::default()).unwrap().dump_text()
    );
    println!("{}", s.sum(&[1], false));
    let a = Tensor::randn(&[3, 4], 2);
    let b = Tensor::randn(&[3, 5], 3);
    let c = a.t().matmul(&b).relu();
    println!(
        "{}",
        c.plan(&RealizeOptions::default()).unwrap().dump_text()
    );
    println!("{}", c);
    println!("{:?}", kiln::reference::evaluate(&c).unwrap().to_f64());
}
