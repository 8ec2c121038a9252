use kiln::*;
use std::time::Instant;
fn chain(x: &Tensor) -> Tensor {
    let y = ((x * 1.5 + 0.5).tanh() * x - 0.25).exp();
    let y = (y * 0.5).maximum(x).sqrt();
    y.sum(&[], false)
}
fn main() {
    let n = 1 << 24;
    let x = Tensor::rand(&[n], 0);
    x.realize().unwrap();
    for fuse in [true, false, true, false] {
        let opts = if fuse {
            RealizeOptions::default()
        } else {
            RealizeOptions::unfused()
        };
        let y = chain(&x);
        memory::reset_peak(Device::Cpu);
        let t = Instant::now();
        let r = y.realize_with(&opts).unwrap();
        let dt = t.elapsed();
        println!(
            "fuse={fuse} kernels={} {:?} peak={} val={}",
            r.kernels,
            dt,
            memory::stats(Device::Cpu).peak_bytes,
            y.item::<f32>().unwrap()
        );
    }
    println!("simd {}", kiln::backend::cpu::simd_level());
    // elementwise only
    for fuse in [true, false, true] {
        let opts = if fuse {
            RealizeOptions::default()
        } else {
            RealizeOptions::unfused()
        };
        let y = (&x * 2.0 + 1.0) * &x;
        let t = Instant::now();
        y.realize_with(&opts).unwrap();
        println!("triad fuse={fuse} {:?}", t.elapsed());
    }
    let a = Tensor::rand(&[4096, 4096], 1);
    a.realize().unwrap();
    for _ in 0..2 {
        let t = Instant::now();
        let s = a.sum(&[1], false);
        s.realize().unwrap();
        println!("rowsum {:?}", t.elapsed());
        let t = Instant::now();
        let s = a.sum(&[0], false);
        s.realize().unwrap();
        println!("colsum {:?}", t.elapsed());
        let t = Instant::now();
        let s = a.softmax(-1);
        s.realize().unwrap();
        println!("softmax {:?}", t.elapsed());
        let t = Instant::now();
        let s = a.t().contiguous();
        s.realize().unwrap();
        println!("transpose {:?}", t.elapsed());
        let t = Instant::now();
        let s = a.matmul(&a);
        s.realize().unwrap();
        println!("matmul 4096 {:?}", t.elapsed());
    }
}
