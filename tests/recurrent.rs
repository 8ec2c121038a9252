//! Recurrent layers (`RnnCell`, `LstmCell`, `GruCell`, `Rnn`, `Lstm`, `Gru`) against plain
//! f64 loops written here from PyTorch's documented equations, using the parameters read
//! out of each module by their PyTorch names: random sizes and every option (layers,
//! directions, batch-first, initial states, unbatched input, biases, projection), PyTorch's
//! parameter lists, state-dict loading by PyTorch's names, the errors, central finite
//! differences in f64 for each cell and a sequence module, dropout between layers, and a
//! small training run. Then `MultiheadAttention` the same way: a loop reference of PyTorch's
//! `multi_head_attention_forward` over random sizes and options (separate key/value sizes,
//! `bias_k`/`bias_v`, zero attention, every mask kind, causal hint, weights averaged or per
//! head, batch-first, unbatched), its parameter lists, errors, gradients and dropout.

mod common;

use common::Rng;
use kiln::nn::{
    Gru, GruCell, Linear, Lstm, LstmCell, Module, MultiheadAttention, MultiheadAttentionArgs,
    MultiheadAttentionOptions, Nonlinearity, RecurrentOptions, Rnn, RnnCell,
};
use kiln::optim::{AdamW, Optimizer};
use kiln::{DType, Tensor, no_grad};
use std::collections::HashMap;

fn uniform(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum K {
    Rnn(Nonlinearity),
    Lstm,
    Gru,
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `W x + b` for `W [rows, x.len()]` row-major.
fn affine(w: &[f64], b: Option<&Vec<f64>>, x: &[f64]) -> Vec<f64> {
    let cols = x.len();
    let rows = w
        .len()
        .checked_div(cols)
        .unwrap_or_else(|| b.map_or(0, |b| b.len()));
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum::<f64>() + b.map_or(0.0, |b| b[r]))
        .collect()
}

/// One layer and direction's parameters as f64, read from the module by name.
struct W {
    ih: Vec<f64>,
    hh: Vec<f64>,
    bih: Option<Vec<f64>>,
    bhh: Option<Vec<f64>>,
    hr: Option<Vec<f64>>,
}

fn read(params: &HashMap<String, Tensor>, suffix: &str) -> W {
    let get = |n: &str| {
        params
            .get(&format!("{n}{suffix}"))
            .map(|t| t.to_vec::<f64>().unwrap())
    };
    W {
        ih: get("weight_ih").unwrap(),
        hh: get("weight_hh").unwrap(),
        bih: get("bias_ih"),
        bhh: get("bias_hh"),
        hr: get("weight_hr"),
    }
}

/// PyTorch's equations for one step: `(h', c')`.
fn ref_step(k: K, w: &W, hidden: usize, x: &[f64], h: &[f64], c: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let gi = affine(&w.ih, w.bih.as_ref(), x);
    let gh = if h.is_empty() {
        w.bhh.clone().unwrap_or_else(|| vec![0.0; gi.len()])
    } else {
        affine(&w.hh, w.bhh.as_ref(), h)
    };
    let n = hidden;
    match k {
        K::Rnn(nl) => {
            let h = (0..n)
                .map(|j| {
                    let v = gi[j] + gh[j];
                    if nl == Nonlinearity::Tanh {
                        v.tanh()
                    } else {
                        v.max(0.0)
                    }
                })
                .collect();
            (h, vec![])
        }
        K::Lstm => {
            let mut c2 = vec![0.0; n];
            let mut h2 = vec![0.0; n];
            for j in 0..n {
                let i = sigmoid(gi[j] + gh[j]);
                let f = sigmoid(gi[n + j] + gh[n + j]);
                let g = (gi[2 * n + j] + gh[2 * n + j]).tanh();
                let o = sigmoid(gi[3 * n + j] + gh[3 * n + j]);
                c2[j] = f * c[j] + i * g;
                h2[j] = o * c2[j].tanh();
            }
            if let Some(hr) = &w.hr {
                h2 = affine(hr, None, &h2);
            }
            (h2, c2)
        }
        K::Gru => {
            let h2 = (0..n)
                .map(|j| {
                    let r = sigmoid(gi[j] + gh[j]);
                    let z = sigmoid(gi[n + j] + gh[n + j]);
                    let nn = (gi[2 * n + j] + r * gh[2 * n + j]).tanh();
                    let hp = if h.is_empty() { 0.0 } else { h[j] };
                    (1.0 - z) * nn + z * hp
                })
                .collect();
            (h2, vec![])
        }
    }
}

/// Settings of one random sequence case.
#[derive(Clone, Copy, Debug)]
struct Case {
    k: K,
    steps: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    opts: RecurrentOptions,
    with_state: bool,
    unbatched: bool,
}

/// The reference over the whole sequence, time-major `x[t][b]`: `(out[t][b], h_n[l][b],
/// c_n[l][b])`.
#[allow(clippy::type_complexity)]
fn ref_sequence(
    c: &Case,
    params: &HashMap<String, Tensor>,
    x: &[Vec<Vec<f64>>],
    h0: Option<&[Vec<Vec<f64>>]>,
    c0: Option<&[Vec<Vec<f64>>]>,
) -> (Vec<Vec<Vec<f64>>>, Vec<Vec<Vec<f64>>>, Vec<Vec<Vec<f64>>>) {
    let dirs = if c.opts.bidirectional { 2 } else { 1 };
    let out = if c.opts.proj_size > 0 {
        c.opts.proj_size
    } else {
        c.hidden
    };
    let mut input = x.to_vec();
    let (mut hn, mut cn) = (vec![], vec![]);
    for layer in 0..c.opts.num_layers {
        let mut next = vec![vec![vec![]; c.batch]; c.steps];
        for d in 0..dirs {
            let i = layer * dirs + d;
            let suffix = format!("_l{layer}{}", if d == 1 { "_reverse" } else { "" });
            let w = read(params, &suffix);
            let mut hs = vec![];
            let mut cs = vec![];
            for b in 0..c.batch {
                let mut h = h0.map_or(vec![0.0; out], |h0| h0[i][b].clone());
                let mut cc = c0.map_or(vec![0.0; c.hidden], |c0| c0[i][b].clone());
                for k in 0..c.steps {
                    let t = if d == 0 { k } else { c.steps - 1 - k };
                    let (h2, c2) = ref_step(c.k, &w, c.hidden, &input[t][b], &h, &cc);
                    next[t][b].extend_from_slice(&h2);
                    h = h2;
                    cc = c2;
                }
                hs.push(h);
                cs.push(cc);
            }
            hn.push(hs);
            cn.push(cs);
        }
        input = next;
    }
    (input, hn, cn)
}

fn make(c: &Case, seed: u64) -> Box<dyn SeqModule> {
    match c.k {
        K::Rnn(nl) => Box::new(
            Rnn::with_options(
                c.input,
                c.hidden,
                RecurrentOptions {
                    nonlinearity: nl,
                    ..c.opts
                },
                seed,
            )
            .unwrap(),
        ),
        K::Lstm => Box::new(Lstm::with_options(c.input, c.hidden, c.opts, seed).unwrap()),
        K::Gru => Box::new(Gru::with_options(c.input, c.hidden, c.opts, seed).unwrap()),
    }
}

/// The three sequence modules behind one call: `(output, h_n, c_n)`.
trait SeqModule: Module {
    fn run(
        &self,
        x: &Tensor,
        h0: Option<&Tensor>,
        c0: Option<&Tensor>,
    ) -> kiln::Result<(Tensor, Tensor, Option<Tensor>)>;
}

impl SeqModule for Rnn {
    fn run(
        &self,
        x: &Tensor,
        h0: Option<&Tensor>,
        _: Option<&Tensor>,
    ) -> kiln::Result<(Tensor, Tensor, Option<Tensor>)> {
        let (y, h) = self.forward_hx(x, h0)?;
        Ok((y, h, None))
    }
}

impl SeqModule for Gru {
    fn run(
        &self,
        x: &Tensor,
        h0: Option<&Tensor>,
        _: Option<&Tensor>,
    ) -> kiln::Result<(Tensor, Tensor, Option<Tensor>)> {
        let (y, h) = self.forward_hx(x, h0)?;
        Ok((y, h, None))
    }
}

impl SeqModule for Lstm {
    fn run(
        &self,
        x: &Tensor,
        h0: Option<&Tensor>,
        c0: Option<&Tensor>,
    ) -> kiln::Result<(Tensor, Tensor, Option<Tensor>)> {
        let state = h0.zip(c0);
        let (y, (h, c)) = self.forward_hx(x, state)?;
        Ok((y, h, Some(c)))
    }
}

fn close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

fn random_case(rng: &mut Rng, k: K) -> Case {
    let hidden = 1 + rng.below(4);
    let proj_size = if k == K::Lstm && hidden > 1 && rng.below(3) == 0 {
        1 + rng.below(hidden - 1)
    } else {
        0
    };
    Case {
        k,
        steps: 1 + rng.below(5),
        batch: 1 + rng.below(3),
        input: 1 + rng.below(4),
        hidden,
        opts: RecurrentOptions {
            num_layers: 1 + rng.below(2),
            bias: rng.below(4) != 0,
            batch_first: rng.below(2) == 0,
            dropout: 0.0,
            bidirectional: rng.below(2) == 0,
            nonlinearity: Nonlinearity::Tanh,
            proj_size,
        },
        with_state: rng.below(2) == 0,
        unbatched: rng.below(4) == 0,
    }
}

/// `v[a][b][c]` flattened, with the first two axes swapped when `swap`.
fn flat3(v: &[Vec<Vec<f64>>], swap: bool) -> Vec<f64> {
    let (a, b) = (v.len(), v[0].len());
    let mut out = vec![];
    if swap {
        for j in 0..b {
            for row in v.iter().take(a) {
                out.extend_from_slice(&row[j]);
            }
        }
    } else {
        for row in v {
            for col in row {
                out.extend_from_slice(col);
            }
        }
    }
    out
}

fn random3(rng: &mut Rng, a: usize, b: usize, c: usize) -> Vec<Vec<Vec<f64>>> {
    (0..a)
        .map(|_| (0..b).map(|_| uniform(rng, c)).collect())
        .collect()
}

fn check_sequence_cases(k: K, seed: u64, cases: usize) {
    let mut rng = Rng(seed);
    for n in 0..cases {
        let mut c = random_case(&mut rng, k);
        if let K::Rnn(_) = k {
            c.k = K::Rnn(if rng.below(2) == 0 {
                Nonlinearity::Tanh
            } else {
                Nonlinearity::Relu
            });
        }
        if c.unbatched {
            c.batch = 1;
        }
        let m = make(&c, n as u64);
        let params: HashMap<String, Tensor> = m.named_parameters().into_iter().collect();
        let dirs = if c.opts.bidirectional { 2 } else { 1 };
        let layers = c.opts.num_layers * dirs;
        let out = if c.opts.proj_size > 0 {
            c.opts.proj_size
        } else {
            c.hidden
        };
        let x = random3(&mut rng, c.steps, c.batch, c.input);
        let h0 = random3(&mut rng, layers, c.batch, out);
        let c0 = random3(&mut rng, layers, c.batch, c.hidden);
        let (want_y, want_h, want_c) = ref_sequence(
            &c,
            &params,
            &x,
            c.with_state.then_some(&h0[..]),
            c.with_state.then_some(&c0[..]),
        );
        // The module's layouts.
        let (xt, h0t, c0t) = if c.unbatched {
            (
                Tensor::from_vec(flat3(&x, false), [c.steps, c.input]),
                Tensor::from_vec(flat3(&h0, false), [layers, out]),
                Tensor::from_vec(flat3(&c0, false), [layers, c.hidden]),
            )
        } else {
            let xs = if c.opts.batch_first {
                [c.batch, c.steps, c.input]
            } else {
                [c.steps, c.batch, c.input]
            };
            (
                Tensor::from_vec(flat3(&x, c.opts.batch_first), xs),
                Tensor::from_vec(flat3(&h0, false), [layers, c.batch, out]),
                Tensor::from_vec(flat3(&c0, false), [layers, c.batch, c.hidden]),
            )
        };
        let xt = xt.cast(DType::F32);
        let (h0t, c0t) = (h0t.cast(DType::F32), c0t.cast(DType::F32));
        let (y, h, cn) = m
            .run(
                &xt,
                c.with_state.then_some(&h0t),
                c.with_state.then_some(&c0t),
            )
            .unwrap();
        let what = format!("case {n} {c:?}");
        let swap = c.opts.batch_first && !c.unbatched;
        let mut yshape = if swap {
            vec![c.batch, c.steps]
        } else {
            vec![c.steps, c.batch]
        };
        yshape.push(dirs * out);
        let mut hshape = vec![layers, c.batch, out];
        let mut cshape = vec![layers, c.batch, c.hidden];
        if c.unbatched {
            yshape.remove(1);
            hshape.remove(1);
            cshape.remove(1);
        }
        assert_eq!(y.shape(), &yshape[..], "{what}: output shape");
        assert_eq!(h.shape(), &hshape[..], "{what}: h_n shape");
        close(
            &y.to_vec::<f64>().unwrap(),
            &flat3(&want_y, swap),
            1e-4,
            &format!("{what}: output"),
        );
        close(
            &h.to_vec::<f64>().unwrap(),
            &flat3(&want_h, false),
            1e-4,
            &format!("{what}: h_n"),
        );
        if k == K::Lstm {
            let cn = cn.unwrap();
            assert_eq!(cn.shape(), &cshape[..], "{what}: c_n shape");
            close(
                &cn.to_vec::<f64>().unwrap(),
                &flat3(&want_c, false),
                1e-4,
                &format!("{what}: c_n"),
            );
        }
        // `Module::forward` is the output from zero states.
        if !c.with_state {
            close(
                &m.forward(&xt).unwrap().to_vec::<f64>().unwrap(),
                &flat3(&want_y, swap),
                1e-4,
                &format!("{what}: forward"),
            );
        }
    }
}

#[test]
fn rnn_matches_the_reference_with_every_option() {
    check_sequence_cases(K::Rnn(Nonlinearity::Tanh), 0xA11, 40);
}

#[test]
fn lstm_matches_the_reference_with_every_option() {
    check_sequence_cases(K::Lstm, 0xB22, 40);
}

#[test]
fn gru_matches_the_reference_with_every_option() {
    check_sequence_cases(K::Gru, 0xC33, 40);
}

#[test]
fn cells_match_the_reference_batched_and_unbatched() {
    let mut rng = Rng(0xCE11);
    for n in 0..36 {
        let (input, hidden, batch) = (1 + rng.below(4), 1 + rng.below(4), 1 + rng.below(3));
        let bias = rng.below(3) != 0;
        let with_state = rng.below(2) == 0;
        let unbatched = rng.below(3) == 0;
        let k = match n % 4 {
            0 => K::Rnn(Nonlinearity::Tanh),
            1 => K::Rnn(Nonlinearity::Relu),
            2 => K::Lstm,
            _ => K::Gru,
        };
        let b = if unbatched { 1 } else { batch };
        let x = uniform(&mut rng, b * input);
        let h = uniform(&mut rng, b * hidden);
        let cs = uniform(&mut rng, b * hidden);
        let shape = |f: usize| if unbatched { vec![f] } else { vec![b, f] };
        let xt = Tensor::from_vec(x.clone(), shape(input)).cast(DType::F32);
        let ht = Tensor::from_vec(h.clone(), shape(hidden)).cast(DType::F32);
        let ct = Tensor::from_vec(cs.clone(), shape(hidden)).cast(DType::F32);
        let (got_h, got_c, params) = match k {
            K::Rnn(nl) => {
                let m = RnnCell::new(input, hidden, bias, nl, n).unwrap();
                assert_eq!(m.nonlinearity(), nl);
                let y = m.forward_hx(&xt, with_state.then_some(&ht)).unwrap();
                (y, None, m.named_parameters())
            }
            K::Lstm => {
                let m = LstmCell::new(input, hidden, bias, n).unwrap();
                let (y, c) = m.forward_hx(&xt, with_state.then_some((&ht, &ct))).unwrap();
                (y, Some(c), m.named_parameters())
            }
            K::Gru => {
                let m = GruCell::new(input, hidden, bias, n).unwrap();
                let y = m.forward_hx(&xt, with_state.then_some(&ht)).unwrap();
                (y, None, m.named_parameters())
            }
        };
        let params: HashMap<String, Tensor> = params.into_iter().collect();
        let w = read(&params, "");
        assert_eq!(got_h.shape(), &shape(hidden)[..], "case {n}");
        let (mut wh, mut wc) = (vec![], vec![]);
        for r in 0..b {
            let hp = if with_state {
                h[r * hidden..(r + 1) * hidden].to_vec()
            } else {
                vec![0.0; hidden]
            };
            let cp = if with_state {
                cs[r * hidden..(r + 1) * hidden].to_vec()
            } else {
                vec![0.0; hidden]
            };
            let (h2, c2) = ref_step(k, &w, hidden, &x[r * input..(r + 1) * input], &hp, &cp);
            wh.extend(h2);
            wc.extend(c2);
        }
        close(
            &got_h.to_vec::<f64>().unwrap(),
            &wh,
            1e-5,
            &format!("cell case {n} {k:?} h"),
        );
        if let Some(c) = got_c {
            assert_eq!(c.shape(), &shape(hidden)[..]);
            close(
                &c.to_vec::<f64>().unwrap(),
                &wc,
                1e-5,
                &format!("cell case {n} c"),
            );
        }
    }
}

fn names(m: &dyn Module) -> Vec<(String, Vec<usize>)> {
    m.named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec()))
        .collect()
}

fn expect(list: &[(&str, &[usize])]) -> Vec<(String, Vec<usize>)> {
    list.iter()
        .map(|(n, s)| (n.to_string(), s.to_vec()))
        .collect()
}

/// The lists PyTorch's `named_parameters()` gives for the same constructors.
#[test]
fn parameter_names_and_shapes_are_pytorchs() {
    let cell = LstmCell::new(3, 5, true, 0).unwrap();
    assert_eq!(
        names(&cell),
        expect(&[
            ("weight_ih", &[20, 3]),
            ("weight_hh", &[20, 5]),
            ("bias_ih", &[20]),
            ("bias_hh", &[20]),
        ])
    );
    let cell = GruCell::new(3, 5, false, 0).unwrap();
    assert_eq!(
        names(&cell),
        expect(&[("weight_ih", &[15, 3]), ("weight_hh", &[15, 5])])
    );
    let cell = RnnCell::new(2, 4, true, Nonlinearity::Relu, 0).unwrap();
    assert_eq!(
        names(&cell),
        expect(&[
            ("weight_ih", &[4, 2]),
            ("weight_hh", &[4, 4]),
            ("bias_ih", &[4]),
            ("bias_hh", &[4])
        ])
    );
    // nn.GRU(3, 4, num_layers=2, bidirectional=True)
    let gru = Gru::with_options(
        3,
        4,
        RecurrentOptions {
            num_layers: 2,
            bidirectional: true,
            ..Default::default()
        },
        0,
    )
    .unwrap();
    assert_eq!(
        names(&gru),
        expect(&[
            ("weight_ih_l0", &[12, 3]),
            ("weight_hh_l0", &[12, 4]),
            ("bias_ih_l0", &[12]),
            ("bias_hh_l0", &[12]),
            ("weight_ih_l0_reverse", &[12, 3]),
            ("weight_hh_l0_reverse", &[12, 4]),
            ("bias_ih_l0_reverse", &[12]),
            ("bias_hh_l0_reverse", &[12]),
            ("weight_ih_l1", &[12, 8]),
            ("weight_hh_l1", &[12, 4]),
            ("bias_ih_l1", &[12]),
            ("bias_hh_l1", &[12]),
            ("weight_ih_l1_reverse", &[12, 8]),
            ("weight_hh_l1_reverse", &[12, 4]),
            ("bias_ih_l1_reverse", &[12]),
            ("bias_hh_l1_reverse", &[12]),
        ])
    );
    // nn.LSTM(10, 20, num_layers=2, proj_size=5)
    let lstm = Lstm::with_options(
        10,
        20,
        RecurrentOptions {
            num_layers: 2,
            proj_size: 5,
            ..Default::default()
        },
        0,
    )
    .unwrap();
    assert_eq!(
        names(&lstm),
        expect(&[
            ("weight_ih_l0", &[80, 10]),
            ("weight_hh_l0", &[80, 5]),
            ("bias_ih_l0", &[80]),
            ("bias_hh_l0", &[80]),
            ("weight_hr_l0", &[5, 20]),
            ("weight_ih_l1", &[80, 5]),
            ("weight_hh_l1", &[80, 5]),
            ("bias_ih_l1", &[80]),
            ("bias_hh_l1", &[80]),
            ("weight_hr_l1", &[5, 20]),
        ])
    );
    // nn.RNN(2, 3, bias=False, bidirectional=True)
    let rnn = Rnn::with_options(
        2,
        3,
        RecurrentOptions {
            bias: false,
            bidirectional: true,
            ..Default::default()
        },
        0,
    )
    .unwrap();
    assert_eq!(
        names(&rnn),
        expect(&[
            ("weight_ih_l0", &[3, 2]),
            ("weight_hh_l0", &[3, 3]),
            ("weight_ih_l0_reverse", &[3, 2]),
            ("weight_hh_l0_reverse", &[3, 3]),
        ])
    );
    assert_eq!(rnn.weights().len(), 2);
    assert_eq!((rnn.input_size(), rnn.hidden_size()), (2, 3));
    assert!(rnn.options().bidirectional);
}

/// PyTorch's initialization: every parameter uniform in ±1/√hidden, and parameters differ.
#[test]
fn initialization_is_uniform_within_one_over_sqrt_hidden() {
    let lstm = Lstm::with_options(
        6,
        16,
        RecurrentOptions {
            num_layers: 2,
            bidirectional: true,
            ..Default::default()
        },
        3,
    )
    .unwrap();
    let bound = 0.25;
    let mut firsts = vec![];
    for (name, p) in lstm.named_parameters() {
        assert_eq!(p.dtype(), DType::F32);
        assert!(p.requires_grad(), "{name}");
        let v = p.to_vec::<f64>().unwrap();
        assert!(v.iter().all(|x| x.abs() <= bound), "{name} out of ±{bound}");
        let max = v.iter().cloned().fold(0.0, |a: f64, b| a.max(b.abs()));
        assert!(max > 0.8 * bound, "{name}: values span the range ({max})");
        firsts.push(v[0]);
    }
    let mut sorted = firsts.clone();
    sorted.sort_by(f64::total_cmp);
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        firsts.len(),
        "each parameter draws its own values"
    );
    // The same seed gives the same values.
    let again = Lstm::with_options(
        6,
        16,
        RecurrentOptions {
            num_layers: 2,
            bidirectional: true,
            ..Default::default()
        },
        3,
    )
    .unwrap();
    assert_eq!(
        again.parameters()[5].to_vec::<f32>().unwrap(),
        lstm.parameters()[5].to_vec::<f32>().unwrap()
    );
}

/// A state dict written with PyTorch's names (as `safetensors.torch.save_file(lstm.state_dict())`
/// writes one) loads into the module by name, and the module then computes with it.
#[test]
fn a_state_dict_with_pytorchs_names_loads() {
    let opts = RecurrentOptions {
        bidirectional: true,
        ..Default::default()
    };
    let src = Gru::with_options(2, 3, opts, 11).unwrap();
    let dst = Gru::with_options(2, 3, opts, 12).unwrap();
    let named: Vec<(String, Tensor)> = src.named_parameters();
    let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    assert!(refs.iter().any(|(n, _)| *n == "bias_hh_l0_reverse"));
    let bytes = kiln::safetensors::save_to_bytes(&refs).unwrap();
    kiln::safetensors::load_state_dict_from_bytes(&dst, &bytes).unwrap();
    let x = Tensor::randn_seeded([4, 2, 2], 5);
    assert_eq!(
        src.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        dst.forward(&x).unwrap().to_vec::<f32>().unwrap()
    );
}

fn err_text(r: kiln::Result<impl std::fmt::Debug>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn bad_inputs_and_options_are_refused_with_their_shapes() {
    let lstm = Lstm::with_options(
        3,
        4,
        RecurrentOptions {
            num_layers: 2,
            ..Default::default()
        },
        0,
    )
    .unwrap();
    // Wrong feature count.
    let e = err_text(lstm.forward_hx(&Tensor::ones([5, 2, 4]), None));
    assert!(
        e.contains("LSTM") && e.contains("input_size") && e.contains("[5, 2, 4]"),
        "{e}"
    );
    // Wrong rank.
    let e = err_text(lstm.forward_hx(&Tensor::ones([5, 2, 1, 3]), None));
    assert!(e.contains("LSTM") && e.contains("4-D"), "{e}");
    // Integer input.
    let e = err_text(lstm.forward_hx(&Tensor::ones_dtype([5, 3], DType::I64), None));
    assert!(e.contains("LSTM") && e.contains("i64"), "{e}");
    // Empty sequence.
    let e = err_text(lstm.forward_hx(&Tensor::ones([0, 2, 3]), None));
    assert!(e.contains("sequence length"), "{e}");
    // Bad h_0 / c_0 shapes.
    let (h, c) = (Tensor::zeros([2, 2, 4]), Tensor::zeros([2, 2, 4]));
    let x = Tensor::ones([5, 2, 3]);
    assert!(lstm.forward_hx(&x, Some((&h, &c))).is_ok());
    let bad = Tensor::zeros([1, 2, 4]);
    let e = err_text(lstm.forward_hx(&x, Some((&bad, &c))));
    assert!(
        e.contains("h_0") && e.contains("[1, 2, 4]") && e.contains("[2, 2, 4]"),
        "{e}"
    );
    let e = err_text(lstm.forward_hx(&x, Some((&h, &Tensor::zeros([2, 3, 4])))));
    assert!(e.contains("c_0") && e.contains("[2, 3, 4]"), "{e}");
    // Unbatched input with a batched state.
    let e = err_text(lstm.forward_hx(&Tensor::ones([5, 3]), Some((&h, &c))));
    assert!(e.contains("unbatched") && e.contains("[2, 4]"), "{e}");
    let gru = Gru::new(3, 4, 0).unwrap();
    let e = err_text(gru.forward_hx(&x, Some(&Tensor::zeros([1, 2, 5]))));
    assert!(e.contains("GRU") && e.contains("[1, 2, 4]"), "{e}");
    // Cells.
    let cell = GruCell::new(3, 4, true, 0).unwrap();
    let e = err_text(cell.forward_hx(&Tensor::ones([2, 2, 3]), None));
    assert!(e.contains("GRUCell") && e.contains("3-D"), "{e}");
    let e = err_text(cell.forward_hx(&Tensor::ones([2, 5]), None));
    assert!(e.contains("GRUCell") && e.contains("input_size"), "{e}");
    let e = err_text(cell.forward_hx(&Tensor::ones([2, 3]), Some(&Tensor::zeros([3, 4]))));
    assert!(e.contains("hx") && e.contains("[2, 4]"), "{e}");
    let lc = LstmCell::new(3, 4, true, 0).unwrap();
    let e = err_text(lc.forward_hx(
        &Tensor::ones([3]),
        Some((&Tensor::zeros([4]), &Tensor::zeros([1, 4]))),
    ));
    assert!(e.contains("cx") && e.contains("[1, 4]"), "{e}");
    // Options.
    let with = |o: RecurrentOptions| err_text(Lstm::with_options(3, 4, o, 0));
    assert!(
        with(RecurrentOptions {
            num_layers: 0,
            ..Default::default()
        })
        .contains("num_layers")
    );
    assert!(
        with(RecurrentOptions {
            dropout: 1.5,
            ..Default::default()
        })
        .contains("dropout")
    );
    assert!(
        with(RecurrentOptions {
            proj_size: 4,
            ..Default::default()
        })
        .contains("proj_size")
    );
    assert!(
        with(RecurrentOptions {
            nonlinearity: Nonlinearity::Relu,
            ..Default::default()
        })
        .contains("nonlinearity")
    );
    let e = err_text(Gru::with_options(
        3,
        4,
        RecurrentOptions {
            proj_size: 2,
            ..Default::default()
        },
        0,
    ));
    assert!(e.contains("GRU") && e.contains("proj_size"), "{e}");
    assert!(err_text(Rnn::new(3, 0, 0)).contains("hidden_size"));
    assert!(err_text(RnnCell::new(3, 0, true, Nonlinearity::Tanh, 0)).contains("hidden_size"));
}

/// Replaces every parameter with the f64 values `data` (leaves that require grad).
fn set_params(m: &mut dyn Module, data: &[Vec<f64>]) {
    let mut i = 0;
    m.visit_parameters_mut(&mut |_, p| {
        let t = Tensor::from_vec(data[i].clone(), p.shape()).requires_grad_(true);
        t.realize().unwrap();
        *p = t;
        i += 1;
    });
}

/// Central differences in f64 of `Σ w ⊙ f(module, inputs)` with respect to every
/// parameter and every input, against the recorded backward pass.
fn gradcheck<M: Module>(
    name: &str,
    m: &mut M,
    inputs: &[(Vec<f64>, Vec<usize>)],
    f: &dyn Fn(&M, &[Tensor]) -> Vec<Tensor>,
) {
    let params: Vec<Vec<f64>> = m
        .parameters()
        .iter()
        .map(|p| p.to_vec::<f64>().unwrap())
        .collect();
    set_params(m, &params);
    let mut rng = Rng(0x9C);
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|(d, s)| {
            let t = Tensor::from_vec(d.clone(), &s[..]).requires_grad_(true);
            t.realize().unwrap();
            t
        })
        .collect();
    let outs = f(m, &leaves);
    let weights: Vec<Tensor> = outs
        .iter()
        .map(|o| Tensor::from_vec(uniform(&mut rng, o.numel()), o.shape()))
        .collect();
    let loss_of = |outs: Vec<Tensor>| {
        outs.iter()
            .zip(&weights)
            .map(|(o, w)| (o * w).sum(..))
            .reduce(|a, b| a + b)
            .unwrap()
    };
    loss_of(outs).backward().unwrap();
    let h = 1e-6;
    // Parameters.
    let grads: Vec<Vec<f64>> = m
        .parameters()
        .iter()
        .map(|p| p.grad().unwrap().to_vec::<f64>().unwrap())
        .collect();
    let plain_inputs: Vec<Tensor> = inputs
        .iter()
        .map(|(d, s)| Tensor::from_vec(d.clone(), &s[..]))
        .collect();
    for (pi, pdata) in params.iter().enumerate() {
        for j in 0..pdata.len() {
            let at = |delta: f64, m: &mut M| {
                let mut p = params.clone();
                p[pi][j] += delta;
                set_params(m, &p);
                no_grad(|| loss_of(f(m, &plain_inputs)).item::<f64>().unwrap())
            };
            let numeric = (at(h, m) - at(-h, m)) / (2.0 * h);
            let got = grads[pi][j];
            assert!(
                (got - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "{name}: parameter {pi}[{j}]: backward {got} vs numeric {numeric}"
            );
        }
    }
    set_params(m, &params);
    for (ii, (data, shape)) in inputs.iter().enumerate() {
        let got = leaves[ii].grad().unwrap().to_vec::<f64>().unwrap();
        for j in 0..data.len() {
            let at = |delta: f64| {
                let xs: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(k, (d, s))| {
                        let mut d = d.clone();
                        if k == ii {
                            d[j] += delta;
                        }
                        Tensor::from_vec(d, &s[..])
                    })
                    .collect();
                no_grad(|| loss_of(f(m, &xs)).item::<f64>().unwrap())
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            assert!(
                (got[j] - numeric).abs() <= 1e-6 * (1.0 + numeric.abs()),
                "{name}: input {ii}{shape:?}[{j}]: backward {} vs numeric {numeric}",
                got[j]
            );
        }
    }
}

#[test]
fn cell_gradients_match_finite_differences() {
    let mut rng = Rng(0x6AD);
    let (b, i, h) = (2, 3, 2);
    let x = (uniform(&mut rng, b * i), vec![b, i]);
    let hx = (uniform(&mut rng, b * h), vec![b, h]);
    let cx = (uniform(&mut rng, b * h), vec![b, h]);
    for nl in [Nonlinearity::Tanh, Nonlinearity::Relu] {
        let mut cell = RnnCell::new(i, h, true, nl, 1).unwrap();
        gradcheck("RnnCell", &mut cell, &[x.clone(), hx.clone()], &|m, xs| {
            vec![
                m.forward(&xs[0]).unwrap(),
                m.forward_hx(&xs[0], Some(&xs[1])).unwrap(),
            ]
        });
    }
    let mut cell = LstmCell::new(i, h, true, 2).unwrap();
    gradcheck(
        "LstmCell",
        &mut cell,
        &[x.clone(), hx.clone(), cx],
        &|m, xs| {
            let (h2, c2) = m.forward_hx(&xs[0], Some((&xs[1], &xs[2]))).unwrap();
            vec![h2, c2, m.forward(&xs[0]).unwrap()]
        },
    );
    let mut cell = GruCell::new(i, h, true, 3).unwrap();
    gradcheck("GruCell", &mut cell, &[x, hx], &|m, xs| {
        vec![
            m.forward_hx(&xs[0], Some(&xs[1])).unwrap(),
            m.forward(&xs[0]).unwrap(),
        ]
    });
}

/// Through time, layers and both directions: a two-layer bidirectional LSTM with a
/// projection and given states.
#[test]
fn sequence_gradients_match_finite_differences() {
    let mut rng = Rng(0x5E9);
    let (t, b, i, h, p) = (3, 2, 2, 3, 2);
    let opts = RecurrentOptions {
        num_layers: 2,
        bidirectional: true,
        proj_size: p,
        batch_first: true,
        ..Default::default()
    };
    let mut lstm = Lstm::with_options(i, h, opts, 4).unwrap();
    let x = (uniform(&mut rng, b * t * i), vec![b, t, i]);
    let h0 = (uniform(&mut rng, 4 * b * p), vec![4, b, p]);
    let c0 = (uniform(&mut rng, 4 * b * h), vec![4, b, h]);
    gradcheck("Lstm", &mut lstm, &[x, h0, c0], &|m, xs| {
        let (y, (hn, cn)) = m.forward_hx(&xs[0], Some((&xs[1], &xs[2]))).unwrap();
        vec![y, hn, cn]
    });
}

/// Dropout between layers: on in training (seeded: a fresh mask each call), off in
/// evaluation, where the output equals a dropout-free module's.
#[test]
fn dropout_between_layers_acts_in_training_only() {
    let opts = RecurrentOptions {
        num_layers: 2,
        dropout: 0.5,
        ..Default::default()
    };
    let mut gru = Gru::with_options(3, 8, opts, 9).unwrap();
    let plain = Gru::with_options(
        3,
        8,
        RecurrentOptions {
            num_layers: 2,
            ..Default::default()
        },
        9,
    )
    .unwrap();
    let x = Tensor::randn_seeded([6, 4, 3], 2);
    let want = plain.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let a = gru.forward(&x).unwrap().to_vec::<f32>().unwrap();
    let b = gru.forward(&x).unwrap().to_vec::<f32>().unwrap();
    assert_ne!(a, want, "training applies dropout");
    assert_ne!(a, b, "each forward draws a new mask");
    gru.set_training(false);
    assert_eq!(gru.forward(&x).unwrap().to_vec::<f32>().unwrap(), want);
    // One layer: nothing to drop between (PyTorch only warns).
    let one = Gru::with_options(
        3,
        8,
        RecurrentOptions {
            dropout: 0.5,
            ..Default::default()
        },
        9,
    )
    .unwrap();
    let single = Gru::new(3, 8, 9).unwrap();
    assert_eq!(
        one.forward(&x).unwrap().to_vec::<f32>().unwrap(),
        single.forward(&x).unwrap().to_vec::<f32>().unwrap()
    );
}

/// A GRU and an LSTM learn to output the mean of a sequence of numbers (read through a
/// linear head on the last hidden state): the loss falls at least tenfold.
#[test]
fn gru_and_lstm_learn_a_running_mean() {
    let mut rng = Rng(0x7EA);
    let (t, b) = (6, 16);
    let xs = uniform(&mut rng, t * b);
    let target: Vec<f64> = (0..b)
        .map(|j| (0..t).map(|s| xs[s * b + j]).sum::<f64>() / t as f64)
        .collect();
    let x = Tensor::from_vec(xs, [t, b, 1]).cast(DType::F32);
    let y = Tensor::from_vec(target, [b, 1]).cast(DType::F32);
    for lstm in [false, true] {
        let rnn: Box<dyn SeqModule> = if lstm {
            Box::new(Lstm::new(1, 8, 1).unwrap())
        } else {
            Box::new(Gru::new(1, 8, 1).unwrap())
        };
        let head = Linear::new(8, 1, true, 2).unwrap();
        let mut params = rnn.parameters();
        params.extend(head.parameters());
        let mut opt = AdamW::new(params, 0.03, (0.9, 0.999), 1e-8, 0.0).unwrap();
        let mut losses = vec![];
        for _ in 0..80 {
            opt.zero_grad();
            let (_, h, _) = rnn.run(&x, None, None).unwrap();
            let pred = head.forward(&h.select(0, 0)).unwrap();
            let d = &pred - &y;
            let loss = (&d * &d).mean(..);
            loss.backward().unwrap();
            opt.step().unwrap();
            losses.push(loss.item::<f32>().unwrap());
        }
        let (first, last) = (losses[0], losses[losses.len() - 1]);
        assert!(
            last.is_finite() && last * 10.0 < first,
            "lstm={lstm}: loss {first} -> {last}"
        );
    }
}

/// A 2-layer bidirectional LSTM over 32 steps: forward and backward plan and run as one
/// graph, and the gradient reaches the first time step's input.
#[test]
fn a_long_sequence_runs_forward_and_backward() {
    let opts = RecurrentOptions {
        num_layers: 2,
        bidirectional: true,
        ..Default::default()
    };
    let lstm = Lstm::with_options(8, 16, opts, 0).unwrap();
    let x = Tensor::randn_seeded([32, 4, 8], 1).requires_grad_(true);
    x.realize().unwrap();
    let start = std::time::Instant::now();
    let (y, (h, c)) = lstm.forward_hx(&x, None).unwrap();
    let loss = y.sum(..) + h.sum(..) + c.sum(..);
    loss.backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    eprintln!(
        "32-step 2-layer bidirectional LSTM forward+backward: {:?}",
        start.elapsed()
    );
    assert_eq!(g.len(), 32 * 4 * 8);
    assert!(g.iter().all(|v| v.is_finite()));
    assert!(g[..32].iter().any(|v| *v != 0.0));
    for p in lstm.parameters() {
        assert!(p.grad().is_some());
    }
}

// ---------------------------------------------------------------------------------------
// nn::MultiheadAttention (in this file to share the gradient check above).

/// One random `MultiheadAttention` case.
#[derive(Clone, Copy, Debug)]
struct Mha {
    heads: usize,
    head_dim: usize,
    l: usize,
    s: usize,
    n: usize,
    kdim: usize,
    vdim: usize,
    opts: MultiheadAttentionOptions,
    unbatched: bool,
    /// 0 none, 1 bool, 2 float.
    kpm: usize,
    /// 0 none, 1 bool 2-D, 2 float 2-D, 3 bool 3-D, 4 float 3-D, 5 causal bool + is_causal.
    mask: usize,
    need_weights: bool,
    average: bool,
}

/// PyTorch's `multi_head_attention_forward` as loops: `(out[l][n], weights[n][h][l][s'])`.
/// `attn(n, h, i, j)` and `kpm(n, j)` are the additive masks over the original sources.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn ref_mha(
    c: &Mha,
    p: &HashMap<String, Vec<f64>>,
    q: &[Vec<Vec<f64>>],
    k: &[Vec<Vec<f64>>],
    v: &[Vec<Vec<f64>>],
    attn: &dyn Fn(usize, usize, usize, usize) -> f64,
    kpm: &dyn Fn(usize, usize) -> f64,
    causal: bool,
) -> (Vec<Vec<Vec<f64>>>, Vec<Vec<Vec<Vec<f64>>>>) {
    let e = c.heads * c.head_dim;
    let d = c.head_dim;
    let (wq, wk, wv) = match p.get("in_proj_weight") {
        Some(w) => (
            w[..e * e].to_vec(),
            w[e * e..2 * e * e].to_vec(),
            w[2 * e * e..].to_vec(),
        ),
        None => (
            p["q_proj_weight"].clone(),
            p["k_proj_weight"].clone(),
            p["v_proj_weight"].clone(),
        ),
    };
    let b = p.get("in_proj_bias");
    let part = |i: usize| b.map(|b| b[i * e..(i + 1) * e].to_vec());
    let (bq, bk, bv) = (part(0), part(1), part(2));
    let mut out = vec![vec![vec![]; c.n]; c.l];
    let mut weights = vec![];
    for n in 0..c.n {
        let qp: Vec<Vec<f64>> = (0..c.l)
            .map(|i| affine(&wq, bq.as_ref(), &q[i][n]))
            .collect();
        let mut kp: Vec<Vec<f64>> = (0..c.s)
            .map(|j| affine(&wk, bk.as_ref(), &k[j][n]))
            .collect();
        let mut vp: Vec<Vec<f64>> = (0..c.s)
            .map(|j| affine(&wv, bv.as_ref(), &v[j][n]))
            .collect();
        if let (Some(bk), Some(bv)) = (p.get("bias_k"), p.get("bias_v")) {
            kp.push(bk.clone());
            vp.push(bv.clone());
        }
        if c.opts.add_zero_attn {
            kp.push(vec![0.0; e]);
            vp.push(vec![0.0; e]);
        }
        let s2 = kp.len();
        let mut concat = vec![vec![0.0; e]; c.l];
        let mut wn = vec![];
        for h in 0..c.heads {
            let mut wh = vec![];
            for i in 0..c.l {
                let scores: Vec<f64> = (0..s2)
                    .map(|j| {
                        let dot: f64 = (0..d).map(|t| qp[i][h * d + t] * kp[j][h * d + t]).sum();
                        let bias = if causal {
                            if j > i { f64::NEG_INFINITY } else { 0.0 }
                        } else if j < c.s {
                            attn(n, h, i, j) + kpm(n, j)
                        } else {
                            0.0
                        };
                        dot / (d as f64).sqrt() + bias
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let w: Vec<f64> = if m == f64::NEG_INFINITY {
                    vec![0.0; s2]
                } else {
                    let ex: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = ex.iter().sum();
                    ex.iter().map(|x| x / z).collect()
                };
                for t in 0..d {
                    concat[i][h * d + t] = (0..s2).map(|j| w[j] * vp[j][h * d + t]).sum();
                }
                wh.push(w);
            }
            wn.push(wh);
        }
        for i in 0..c.l {
            out[i][n] = affine(&p["out_proj.weight"], p.get("out_proj.bias"), &concat[i]);
        }
        weights.push(wn);
    }
    (out, weights)
}

fn random_mha(rng: &mut Rng) -> Mha {
    let (heads, head_dim) = (1 + rng.below(3), 1 + rng.below(3));
    let e = heads * head_dim;
    let separate = rng.below(3) == 0;
    let mut c = Mha {
        heads,
        head_dim,
        l: 1 + rng.below(4),
        s: 1 + rng.below(4),
        n: 1 + rng.below(3),
        kdim: if separate { 1 + rng.below(4) } else { e },
        vdim: if separate { 1 + rng.below(4) } else { e },
        opts: MultiheadAttentionOptions {
            dropout: 0.0,
            bias: rng.below(4) != 0,
            add_bias_kv: rng.below(3) == 0,
            add_zero_attn: rng.below(3) == 0,
            kdim: None,
            vdim: None,
            batch_first: rng.below(2) == 0,
        },
        unbatched: rng.below(4) == 0,
        kpm: rng.below(3),
        mask: rng.below(6),
        need_weights: rng.below(3) != 0,
        average: rng.below(2) == 0,
    };
    if separate {
        c.opts.kdim = Some(c.kdim);
        c.opts.vdim = Some(c.vdim);
    }
    if c.unbatched {
        c.n = 1;
    }
    c
}

/// The module's layout of `[seq][batch][f]` data.
fn mha_layout(c: &Mha, v: &[Vec<Vec<f64>>], seq: usize, f: usize) -> Tensor {
    if c.unbatched {
        Tensor::from_vec(flat3(v, false), [seq, f])
    } else if c.opts.batch_first {
        Tensor::from_vec(flat3(v, true), [c.n, seq, f])
    } else {
        Tensor::from_vec(flat3(v, false), [seq, c.n, f])
    }
}

#[test]
fn multihead_attention_matches_the_reference_with_every_option() {
    let mut rng = Rng(0x4EAD);
    for case in 0..80 {
        let c = random_mha(&mut rng);
        let e = c.heads * c.head_dim;
        let m = MultiheadAttention::with_options(e, c.heads, c.opts, case).unwrap();
        let p: HashMap<String, Vec<f64>> = m
            .named_parameters()
            .into_iter()
            .map(|(n, t)| (n, t.to_vec::<f64>().unwrap()))
            .collect();
        let q = random3(&mut rng, c.l, c.n, e);
        let k = random3(&mut rng, c.s, c.n, c.kdim);
        let v = random3(&mut rng, c.s, c.n, c.vdim);
        // Masks: bool true = masked.
        let kpm_bool: Vec<bool> = (0..c.n * c.s).map(|_| rng.below(4) == 0).collect();
        let kpm_float = uniform(&mut rng, c.n * c.s);
        let rows = if (3..5).contains(&c.mask) {
            c.n * c.heads
        } else {
            1
        };
        let mask_bool: Vec<bool> = (0..rows * c.l * c.s).map(|_| rng.below(4) == 0).collect();
        let mask_float = uniform(&mut rng, rows * c.l * c.s);
        let causal_bool: Vec<bool> = (0..c.l * c.s).map(|ij| ij % c.s > ij / c.s).collect();
        let kpm_fn = |n: usize, j: usize| match c.kpm {
            1 if kpm_bool[n * c.s + j] => f64::NEG_INFINITY,
            2 => kpm_float[n * c.s + j],
            _ => 0.0,
        };
        let attn_fn = |n: usize, h: usize, i: usize, j: usize| {
            let r = if rows > 1 { n * c.heads + h } else { 0 };
            let at = (r * c.l + i) * c.s + j;
            match c.mask {
                1 | 3 if mask_bool[at] => f64::NEG_INFINITY,
                2 | 4 => mask_float[at],
                5 if causal_bool[i * c.s + j] => f64::NEG_INFINITY,
                _ => 0.0,
            }
        };
        let is_causal = c.mask == 5;
        let causal = is_causal && c.kpm == 0 && !c.need_weights;
        let (want_out, want_w) = ref_mha(&c, &p, &q, &k, &v, &attn_fn, &kpm_fn, causal);
        // The module's tensors.
        let (qt, kt, vt) = (
            mha_layout(&c, &q, c.l, e).cast(DType::F32),
            mha_layout(&c, &k, c.s, c.kdim).cast(DType::F32),
            mha_layout(&c, &v, c.s, c.vdim).cast(DType::F32),
        );
        let kpm_shape: Vec<usize> = if c.unbatched {
            vec![c.s]
        } else {
            vec![c.n, c.s]
        };
        let kpm_t = match c.kpm {
            1 => Some(Tensor::from_vec(kpm_bool.clone(), &kpm_shape[..])),
            2 => Some(Tensor::from_vec(kpm_float.clone(), &kpm_shape[..]).cast(DType::F32)),
            _ => None,
        };
        let mask_shape: Vec<usize> = if rows > 1 {
            vec![rows, c.l, c.s]
        } else {
            vec![c.l, c.s]
        };
        let mask_t = match c.mask {
            1 | 3 => Some(Tensor::from_vec(mask_bool.clone(), &mask_shape[..])),
            2 | 4 => Some(Tensor::from_vec(mask_float.clone(), &mask_shape[..]).cast(DType::F32)),
            5 => Some(Tensor::from_vec(causal_bool.clone(), [c.l, c.s])),
            _ => None,
        };
        let args = MultiheadAttentionArgs {
            key_padding_mask: kpm_t.as_ref(),
            need_weights: c.need_weights,
            attn_mask: mask_t.as_ref(),
            average_attn_weights: c.average,
            is_causal,
        };
        let (out, w) = m.forward_attention(&qt, &kt, &vt, &args).unwrap();
        let what = format!("case {case} {c:?}");
        let swap = c.opts.batch_first && !c.unbatched;
        let want_shape: Vec<usize> = if c.unbatched {
            vec![c.l, e]
        } else if swap {
            vec![c.n, c.l, e]
        } else {
            vec![c.l, c.n, e]
        };
        assert_eq!(out.shape(), &want_shape[..], "{what}: output shape");
        close(
            &out.to_vec::<f64>().unwrap(),
            &flat3(&want_out, swap),
            1e-4,
            &format!("{what}: output"),
        );
        assert_eq!(w.is_some(), c.need_weights, "{what}");
        if let Some(w) = w {
            let s2 = c.s + usize::from(c.opts.add_bias_kv) + usize::from(c.opts.add_zero_attn);
            let mut flat = vec![];
            let mut shape = vec![c.n];
            if c.average {
                shape.extend([c.l, s2]);
                for wn in &want_w {
                    for i in 0..c.l {
                        for j in 0..s2 {
                            flat.push(wn.iter().map(|wh| wh[i][j]).sum::<f64>() / c.heads as f64);
                        }
                    }
                }
            } else {
                shape.extend([c.heads, c.l, s2]);
                flat = want_w
                    .iter()
                    .flatten()
                    .flatten()
                    .flatten()
                    .copied()
                    .collect();
            }
            if c.unbatched {
                shape.remove(0);
            }
            assert_eq!(w.shape(), &shape[..], "{what}: weights shape");
            close(
                &w.to_vec::<f64>().unwrap(),
                &flat,
                1e-5,
                &format!("{what}: weights"),
            );
        }
    }
}

#[test]
fn multihead_attention_parameters_are_pytorchs() {
    let m = MultiheadAttention::new(6, 3, 0).unwrap();
    assert_eq!(
        names(&m),
        expect(&[
            ("in_proj_weight", &[18, 6]),
            ("in_proj_bias", &[18]),
            ("out_proj.weight", &[6, 6]),
            ("out_proj.bias", &[6]),
        ])
    );
    // nn.MultiheadAttention(4, 2, add_bias_kv=True, kdim=3, vdim=5)
    let opts = MultiheadAttentionOptions {
        add_bias_kv: true,
        kdim: Some(3),
        vdim: Some(5),
        ..Default::default()
    };
    let m = MultiheadAttention::with_options(4, 2, opts, 0).unwrap();
    assert_eq!(
        names(&m),
        expect(&[
            ("q_proj_weight", &[4, 4]),
            ("k_proj_weight", &[4, 3]),
            ("v_proj_weight", &[4, 5]),
            ("in_proj_bias", &[12]),
            ("bias_k", &[1, 1, 4]),
            ("bias_v", &[1, 1, 4]),
            ("out_proj.weight", &[4, 4]),
            ("out_proj.bias", &[4]),
        ])
    );
    let m = MultiheadAttention::with_options(
        4,
        1,
        MultiheadAttentionOptions {
            bias: false,
            ..Default::default()
        },
        0,
    )
    .unwrap();
    assert_eq!(
        names(&m),
        expect(&[("in_proj_weight", &[12, 4]), ("out_proj.weight", &[4, 4])])
    );
    assert_eq!((m.embed_dim(), m.num_heads()), (4, 1));
    assert!(!m.options().bias);
    // PyTorch's initialization: xavier-uniform in_proj_weight (bound √(6/(E + 3E))), zero
    // biases, out_proj.weight within ±1/√E.
    let m = MultiheadAttention::new(16, 4, 1).unwrap();
    let p: HashMap<String, Vec<f64>> = m
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec::<f64>().unwrap()))
        .collect();
    let bound = (6.0f64 / 64.0).sqrt();
    let w = &p["in_proj_weight"];
    assert!(w.iter().all(|x| x.abs() <= bound) && w.iter().any(|x| x.abs() > 0.8 * bound));
    assert!(p["in_proj_bias"].iter().all(|x| *x == 0.0));
    assert!(p["out_proj.bias"].iter().all(|x| *x == 0.0));
    assert!(p["out_proj.weight"].iter().all(|x| x.abs() <= 0.25));
}

#[test]
fn multihead_attention_refuses_bad_arguments() {
    let e = err_text(MultiheadAttention::new(6, 4, 0));
    assert!(
        e.contains("MultiheadAttention") && e.contains("divisible"),
        "{e}"
    );
    assert!(err_text(MultiheadAttention::new(6, 0, 0)).contains("num_heads"));
    let m = MultiheadAttention::new(4, 2, 0).unwrap();
    let x = Tensor::ones([3, 2, 4]);
    let call = |q: &Tensor, k: &Tensor, v: &Tensor, args: MultiheadAttentionArgs| {
        err_text(m.forward_attention(q, k, v, &args))
    };
    let d = MultiheadAttentionArgs::default;
    let e = call(&Tensor::ones([3, 2, 5]), &x, &x, d());
    assert!(
        e.contains("MultiheadAttention") && e.contains("[3, 2, 5]"),
        "{e}"
    );
    let e = call(&x, &Tensor::ones([5, 2, 4]), &Tensor::ones([4, 2, 4]), d());
    assert!(e.contains("[5, 2, 4]") && e.contains("[4, 2, 4]"), "{e}");
    let e = call(&Tensor::ones([1, 3, 2, 4]), &x, &x, d());
    assert!(e.contains("4-D"), "{e}");
    let e = call(&x, &Tensor::ones([3, 4]), &Tensor::ones([3, 4]), d());
    assert!(e.contains("same rank"), "{e}");
    let bad_mask = Tensor::zeros([3, 4]);
    let e = call(
        &x,
        &x,
        &x,
        MultiheadAttentionArgs {
            attn_mask: Some(&bad_mask),
            ..d()
        },
    );
    assert!(e.contains("attn_mask") && e.contains("[3, 4]"), "{e}");
    let bad_3d = Tensor::zeros([2, 3, 3]);
    let e = call(
        &x,
        &x,
        &x,
        MultiheadAttentionArgs {
            attn_mask: Some(&bad_3d),
            ..d()
        },
    );
    assert!(e.contains("attn_mask") && e.contains("[4, 3, 3]"), "{e}");
    let bad_kpm = Tensor::zeros([3, 2]);
    let e = call(
        &x,
        &x,
        &x,
        MultiheadAttentionArgs {
            key_padding_mask: Some(&bad_kpm),
            ..d()
        },
    );
    assert!(
        e.contains("key_padding_mask") && e.contains("[2, 3]"),
        "{e}"
    );
    let int_mask = Tensor::zeros_dtype([3, 3], DType::I64);
    let e = call(
        &x,
        &x,
        &x,
        MultiheadAttentionArgs {
            attn_mask: Some(&int_mask),
            ..d()
        },
    );
    assert!(e.contains("attn_mask") && e.contains("i64"), "{e}");
    let e = call(
        &x,
        &x,
        &x,
        MultiheadAttentionArgs {
            is_causal: true,
            ..d()
        },
    );
    assert!(e.contains("is_causal"), "{e}");
    let e = call(&Tensor::ones_dtype([3, 2, 4], DType::I64), &x, &x, d());
    assert!(e.contains("i64"), "{e}");
}

#[test]
fn multihead_attention_gradients_match_finite_differences() {
    let mut rng = Rng(0x6A0);
    let opts = MultiheadAttentionOptions {
        add_bias_kv: true,
        add_zero_attn: true,
        kdim: Some(3),
        ..Default::default()
    };
    let mut m = MultiheadAttention::with_options(4, 2, opts, 5).unwrap();
    // Non-zero biases, so their gradients are checked away from zero.
    m.visit_parameters_mut(&mut |_, p| {
        let t = Tensor::from_vec(uniform(&mut Rng(p.numel() as u64), p.numel()), p.shape())
            .cast(DType::F32);
        *p = t;
    });
    let (l, s, n) = (3, 2, 2);
    let q = (uniform(&mut rng, l * n * 4), vec![l, n, 4]);
    let k = (uniform(&mut rng, s * n * 3), vec![s, n, 3]);
    let v = (uniform(&mut rng, s * n * 4), vec![s, n, 4]);
    let kpm = Tensor::from_vec(vec![false, true, false, false], [n, s]);
    let mask = Tensor::from_vec(uniform(&mut rng, l * s), [l, s]);
    gradcheck("MultiheadAttention", &mut m, &[q, k, v], &|m, xs| {
        let args = MultiheadAttentionArgs {
            key_padding_mask: Some(&kpm),
            attn_mask: Some(&mask),
            average_attn_weights: false,
            ..Default::default()
        };
        let (y, w) = m.forward_attention(&xs[0], &xs[1], &xs[2], &args).unwrap();
        // The path without weights (scaled_dot_product_attention) too.
        let no_w = MultiheadAttentionArgs {
            need_weights: false,
            ..args
        };
        let (y2, _) = m.forward_attention(&xs[0], &xs[1], &xs[2], &no_w).unwrap();
        vec![y, w.unwrap(), y2]
    });
}

/// Dropout on the weights: in training only; the weights returned are after dropout, as
/// PyTorch's; `Module::forward` is self-attention without weights.
#[test]
fn multihead_attention_dropout_and_forward() {
    let opts = MultiheadAttentionOptions {
        dropout: 0.5,
        batch_first: true,
        ..Default::default()
    };
    let mut m = MultiheadAttention::with_options(8, 2, opts, 3).unwrap();
    let plain = MultiheadAttention::with_options(
        8,
        2,
        MultiheadAttentionOptions {
            batch_first: true,
            ..Default::default()
        },
        3,
    )
    .unwrap();
    let x = Tensor::randn_seeded([2, 5, 8], 4);
    let d = MultiheadAttentionArgs::default();
    let (y_plain, w_plain) = plain.forward_attention(&x, &x, &x, &d).unwrap();
    let (y, w) = m.forward_attention(&x, &x, &x, &d).unwrap();
    let w = w.unwrap().to_vec::<f32>().unwrap();
    assert_ne!(y.to_vec::<f32>().unwrap(), y_plain.to_vec::<f32>().unwrap());
    assert!(w.contains(&0.0), "some weights dropped");
    m.set_training(false);
    let (y, w) = m.forward_attention(&x, &x, &x, &d).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), y_plain.to_vec::<f32>().unwrap());
    assert_eq!(
        w.unwrap().to_vec::<f32>().unwrap(),
        w_plain.unwrap().to_vec::<f32>().unwrap()
    );
    close(
        &m.forward(&x).unwrap().to_vec::<f64>().unwrap(),
        &y.to_vec::<f64>().unwrap(),
        1e-6,
        "forward",
    );
}
