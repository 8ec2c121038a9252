//! Convolution and pooling: PyTorch's outputs and gradients for fixed programs
//! (`fixtures/conv_pytorch.rs`, written by `fixtures/make_conv_values.py`), random
//! configurations of every argument against a plain loop evaluator written here from
//! PyTorch's documented formulas, the max-pool tie rule, the errors, and the modules.

use kiln::nn::functional::{
    ConvPadding, adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_max_pool1d,
    adaptive_max_pool2d, adaptive_max_pool2d_with_indices, avg_pool1d, avg_pool2d,
    conv_transpose1d, conv_transpose2d, conv1d, conv2d, conv3d, max_pool1d,
    max_pool1d_with_indices, max_pool2d, max_pool2d_with_indices, max_unpool1d, max_unpool2d,
};
use kiln::nn::{
    AdaptiveAvgPool2d, AvgPool2d, Conv2d, ConvOptions, Flatten, Linear, MaxPool2d, MaxUnpool2d,
    Module, Relu, Sequential,
};
use kiln::optim::Optimizer;
use kiln::{DType, KilnError, RealizeOptions, Tensor};

include!("fixtures/conv_pytorch.rs");

/// `sin(a·i + b)` in f64, rounded to f32: the fixtures' inputs.
fn sines(n: usize, a: f64, b: f64) -> Vec<f32> {
    (0..n).map(|i| (a * i as f64 + b).sin() as f32).collect()
}

fn leaf(data: Vec<f32>, shape: &[usize]) -> Tensor {
    let t = Tensor::from_vec(data, shape).requires_grad_(true);
    t.realize().unwrap();
    t
}

/// `Σ y · cos(0.3 i)`, the fixtures' loss.
fn weighted_sum(y: &Tensor) -> Tensor {
    let w: Vec<f32> = (0..y.numel())
        .map(|i| (0.3 * i as f64).cos() as f32)
        .collect();
    (y * Tensor::from_vec(w, y.shape())).sum(..)
}

fn close(name: &str, got: &Tensor, want: &[f32], tol: f32) {
    let got = got.to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{name}[{i}]: kiln {g}, PyTorch {w}"
        );
    }
}

#[test]
fn conv2d_matches_pytorch_with_groups_strides_padding_and_dilation() {
    let x = leaf(sines(2 * 4 * 5 * 6, 0.7, 0.3), &[2, 4, 5, 6]);
    let w = leaf(sines(6 * 2 * 3 * 2, 1.3, -0.2), &[6, 2, 3, 2]);
    let b = leaf(sines(6, 2.1, 0.5), &[6]);
    let y = conv2d(&x, &w, Some(&b), (2, 1), (1, 2), (1, 2), 2).unwrap();
    assert_eq!(y.shape(), &[2, 6, 3, 8]);
    weighted_sum(&y).backward().unwrap();
    close("conv2d y", &y, &CONV2D_Y, 1e-5);
    close("conv2d dx", &x.grad().unwrap(), &CONV2D_DX, 1e-5);
    close("conv2d dw", &w.grad().unwrap(), &CONV2D_DW, 1e-5);
    close("conv2d db", &b.grad().unwrap(), &CONV2D_DB, 1e-5);
}

#[test]
fn conv1d_same_padding_with_an_even_kernel_matches_pytorch() {
    let x = leaf(sines(3 * 7, 0.7, 0.3), &[1, 3, 7]);
    let w = leaf(sines(2 * 3 * 4, 1.3, -0.2), &[2, 3, 4]);
    let y = conv1d(&x, &w, None, 1, ConvPadding::Same, 1, 1).unwrap();
    assert_eq!(y.shape(), &[1, 2, 7]);
    weighted_sum(&y).backward().unwrap();
    close("conv1d y", &y, &CONV1D_Y, 1e-5);
    close("conv1d dx", &x.grad().unwrap(), &CONV1D_DX, 1e-5);
    close("conv1d dw", &w.grad().unwrap(), &CONV1D_DW, 1e-5);
}

#[test]
fn max_pool2d_matches_pytorch_including_the_gradient_at_ties() {
    // Clamped at 0: many windows hold several zeros, and PyTorch sends each window's
    // gradient to its first largest element only.
    let data: Vec<f32> = sines(2 * 6 * 7, 0.9, 0.1)
        .into_iter()
        .map(|v| v.max(0.0))
        .collect();
    let x = leaf(data, &[1, 2, 6, 7]);
    let y = max_pool2d(&x, 3, 2, 1, 1, true).unwrap();
    assert_eq!(y.shape(), &[1, 2, 4, 4]);
    weighted_sum(&y).backward().unwrap();
    close("max_pool2d y", &y, &MAXPOOL_Y, 0.0);
    close("max_pool2d dx", &x.grad().unwrap(), &MAXPOOL_DX, 1e-6);

    let x = leaf(sines(2 * 7 * 8, 0.45, 0.2), &[2, 1, 7, 8]);
    let y = max_pool2d(&x, (2, 3), (1, 2), (1, 1), 2, false).unwrap();
    assert_eq!(y.shape(), &[2, 1, 7, 3]);
    weighted_sum(&y).backward().unwrap();
    close("dilated max_pool2d y", &y, &MAXPOOL_DIL_Y, 0.0);
    close(
        "dilated max_pool2d dx",
        &x.grad().unwrap(),
        &MAXPOOL_DIL_DX,
        1e-6,
    );
}

#[test]
fn a_window_of_equal_values_gives_its_whole_gradient_to_the_first() {
    let x = leaf(vec![0.0; 16], &[1, 1, 4, 4]);
    let y = max_pool2d(&x, 2, 2, 0, 1, false).unwrap();
    y.sum(..).backward().unwrap();
    let mut want = vec![0.0f32; 16];
    for i in [0, 2, 8, 10] {
        want[i] = 1.0;
    }
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), want);
}

#[test]
fn max_pool_keeps_signed_zeros_infinities_and_nans() {
    // Windows (2×2, stride 2) of -0.0 only, of -inf only, with a NaN, with +inf, and of
    // -0.0 beside +0.0 (the first largest is -0.0: the two compare equal). PyTorch returns
    // the element itself, sign bit included.
    let (nz, inf, nan) = (-0.0f32, f32::INFINITY, f32::NAN);
    #[rustfmt::skip]
    let data = vec![
        nz, nz,    -inf, -inf,  1.0, nan,   2.0, inf,   nz, 0.0,
        nz, nz,    -inf, -inf,  3.0, 4.0,   5.0, 6.0,   0.0, 0.0,
    ];
    let x = leaf(data, &[1, 1, 2, 10]);
    let y = max_pool2d(&x, 2, 2, 0, 1, false).unwrap();
    let got = y.to_vec::<f32>().unwrap();
    assert_eq!(got.len(), 5);
    assert!(got[0] == 0.0 && got[0].is_sign_negative(), "{got:?}");
    assert_eq!(got[1], -inf);
    assert!(got[2].is_nan());
    assert_eq!(got[3], inf);
    assert!(got[4] == 0.0 && got[4].is_sign_negative(), "{got:?}");
    // Each window's gradient reaches one element: the first largest, or the NaN.
    y.sum(..).backward().unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    let mut want = vec![0.0f32; 20];
    for i in [0, 2, 5, 7, 8] {
        want[i] = 1.0;
    }
    assert_eq!(g, want);
}

#[test]
fn windows_are_read_where_the_data_lies() {
    let plan = |t: &Tensor| t.plan(&RealizeOptions::default()).unwrap();
    let x = Tensor::randn_seeded([4, 3, 12, 12], 5);
    x.realize().unwrap();
    // A 3×3 average pool adds its nine taps in one kernel (no stacked copy of the windows).
    let y = avg_pool2d(&x, 3, 1, 1, false, true, None).unwrap();
    assert_eq!(plan(&y).kernel_count(), 1, "{}", plan(&y).dump_text());
    // A padded 3×3 max pool copies its input batch last and nothing else: the windows'
    // positions in the plane are index arithmetic (small tables), not windows of a padded
    // `arange` copied out tap by tap (nine copies before).
    let m = max_pool2d(&x, 3, 1, 1, 1, false).unwrap();
    assert_eq!(plan(&m).copy_count(), 1, "{}", plan(&m).dump_text());
    // With indices: and one more, the indices written batch first for the caller.
    let (_, at) = max_pool2d_with_indices(&x, 3, 1, 1, 1, false).unwrap();
    assert_eq!(plan(&at).copy_count(), 2, "{}", plan(&at).dump_text());
    // A convolution of a stored batch-first input copies it batch last once; the next
    // layer reads the first one's (batch-last) output as it lies.
    let same = ConvOptions {
        padding: 1.into(),
        ..Default::default()
    };
    let first = Conv2d::with_options(3, 8, 3, same, 1).unwrap();
    let second = Conv2d::with_options(8, 8, 3, same, 2).unwrap();
    let h = first.forward(&x).unwrap();
    assert_eq!(plan(&h).copy_count(), 1, "{}", plan(&h).dump_text());
    let z = second.forward(&h.relu()).unwrap();
    assert_eq!(plan(&z).copy_count(), 1, "{}", plan(&z).dump_text());
    // The values are those of the same layers over the input stored batch last and seen
    // batch first (a permute: no copy).
    let stored = x.permute([1, 2, 3, 0]).contiguous();
    stored.realize().unwrap();
    let seen = stored.permute([3, 0, 1, 2]);
    assert_eq!(plan(&first.forward(&seen).unwrap()).copy_count(), 0);
    let want = second
        .forward(&first.forward(&seen).unwrap().relu())
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), want);
}

#[test]
fn avg_pool2d_matches_pytorch_for_every_divisor_rule() {
    let x = leaf(sines(2 * 5 * 7, 0.8, 0.4), &[1, 2, 5, 7]);
    let y = avg_pool2d(&x, 3, 2, 1, true, false, None).unwrap();
    assert_eq!(y.shape(), &[1, 2, 3, 4]);
    weighted_sum(&y).backward().unwrap();
    close("avg_pool2d y", &y, &AVGPOOL_Y, 1e-6);
    close("avg_pool2d dx", &x.grad().unwrap(), &AVGPOOL_DX, 1e-6);

    let x = Tensor::from_vec(sines(25, 0.8, 0.4), [1, 1, 5, 5]);
    let counted = avg_pool2d(&x, 2, 2, 1, true, true, None).unwrap();
    close(
        "avg_pool2d count_include_pad",
        &counted,
        &AVGPOOL_INC_Y,
        1e-6,
    );
    let fixed = avg_pool2d(&x, 3, 2, 1, false, true, Some(2)).unwrap();
    close("avg_pool2d divisor_override", &fixed, &AVGPOOL_DIV_Y, 1e-6);
}

#[test]
fn adaptive_avg_pool2d_matches_pytorch_with_overlapping_cells() {
    let x = leaf(sines(2 * 3 * 5 * 7, 0.6, 0.9), &[2, 3, 5, 7]);
    let y = adaptive_avg_pool2d(&x, (3, 4)).unwrap();
    assert_eq!(y.shape(), &[2, 3, 3, 4]);
    weighted_sum(&y).backward().unwrap();
    close("adaptive y", &y, &ADAPTIVE_Y, 1e-6);
    close("adaptive dx", &x.grad().unwrap(), &ADAPTIVE_DX, 1e-6);
}

#[test]
fn one_dimensional_pools_of_an_unbatched_input_match_pytorch() {
    let x = Tensor::from_vec(sines(18, 0.5, 0.0), [2, 9]);
    close(
        "max_pool1d",
        &max_pool1d(&x, 2, 3, 1, 1, true).unwrap(),
        &MAXPOOL1D_Y,
        0.0,
    );
    close(
        "avg_pool1d",
        &avg_pool1d(&x, 4, 2, 2, false, true).unwrap(),
        &AVGPOOL1D_Y,
        1e-6,
    );
    close(
        "adaptive_avg_pool1d",
        &adaptive_avg_pool1d(&x, 4).unwrap(),
        &ADAPTIVE1D_Y,
        1e-6,
    );
}

#[test]
fn conv_transpose_matches_pytorch_with_groups_output_padding_and_cropping() {
    let x = leaf(sines(2 * 4 * 3 * 4, 0.7, 0.3), &[2, 4, 3, 4]);
    let w = leaf(sines(4 * 3 * 3 * 2, 1.3, -0.2), &[4, 3, 3, 2]);
    let b = leaf(sines(6, 2.1, 0.5), &[6]);
    let y = conv_transpose2d(&x, &w, Some(&b), 2, 1, 1, 2, 1).unwrap();
    assert_eq!(y.shape(), &[2, 6, 6, 7]);
    weighted_sum(&y).backward().unwrap();
    close("conv_transpose2d y", &y, &CONVT2D_Y, 1e-5);
    close("conv_transpose2d dx", &x.grad().unwrap(), &CONVT2D_DX, 1e-5);
    close("conv_transpose2d dw", &w.grad().unwrap(), &CONVT2D_DW, 1e-5);
    close("conv_transpose2d db", &b.grad().unwrap(), &CONVT2D_DB, 1e-5);
    // Unbatched, padding beyond dilation·(k - 1) (the zero-inserted input is cropped).
    let x = Tensor::from_vec(sines(15, 0.7, 0.3), [3, 5]);
    let w = Tensor::from_vec(sines(12, 1.3, -0.2), [3, 2, 2]);
    let y = conv_transpose1d(&x, &w, None, 3, 3, 2, 1, 2).unwrap();
    assert_eq!(y.shape(), &[2, 11]);
    close("conv_transpose1d", &y, &CONVT1D_Y, 1e-5);
    // PyTorch's refusals: output_padding not below stride or dilation; channels.
    let e = conv_transpose2d(
        &Tensor::zeros([1, 4, 3, 3]),
        &Tensor::zeros([4, 2, 3, 3]),
        None,
        2,
        0,
        2,
        1,
        1,
    )
    .unwrap_err();
    assert!(e.to_string().contains("output_padding"), "{e}");
    let e = conv_transpose2d(
        &Tensor::zeros([1, 3, 3, 3]),
        &Tensor::zeros([4, 2, 3, 3]),
        None,
        1,
        0,
        0,
        1,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::ShapeMismatch {
                op: "conv_transpose2d",
                ..
            }
        ),
        "{e}"
    );
}

/// The transposed convolution by its definition (each input element scatters its
/// weighted kernel): `y[n, g·O/G + o, p·s + q·d - pad] += x[n, c, p] · w[c, o, q]`.
#[allow(clippy::too_many_arguments)]
fn conv_transpose_reference(
    x_shape: &[usize],
    w_shape: &[usize],
    x: &[f64],
    w: &[f64],
    s: &[usize],
    pad: &[usize],
    extra: &[usize],
    dil: &[usize],
    groups: usize,
) -> (Vec<usize>, Vec<f64>) {
    let d = s.len();
    let (n, c) = (x_shape[0], x_shape[1]);
    let og = w_shape[1];
    let cg = c / groups;
    let kernel = &w_shape[2..];
    let out: Vec<usize> = (0..d)
        .map(|i| (x_shape[2 + i] - 1) * s[i] + dil[i] * (kernel[i] - 1) + extra[i] + 1 - 2 * pad[i])
        .collect();
    let mut y_shape = vec![n, og * groups];
    y_shape.extend(&out);
    let mut y = vec![0.0; y_shape.iter().product()];
    for xi in indices(x_shape) {
        let (bn, ci, p) = (xi[0], xi[1], &xi[2..]);
        let g = ci / cg;
        for o in 0..og {
            for q in indices(kernel) {
                let mut yi = vec![bn, g * og + o];
                let mut inside = true;
                for i in 0..d {
                    let pos = (p[i] * s[i] + q[i] * dil[i]) as isize - pad[i] as isize;
                    inside &= pos >= 0 && (pos as usize) < out[i];
                    yi.push(pos.max(0) as usize);
                }
                if inside {
                    let mut wi = vec![ci, o];
                    wi.extend(&q);
                    y[flat(&y_shape, &yi)] += x[flat(x_shape, &xi)] * w[flat(w_shape, &wi)];
                }
            }
        }
    }
    (y_shape, y)
}

#[test]
fn random_transposed_convolutions_match_the_definition() {
    let mut rng = Rng(0x7EA5_C0DE);
    let mut tried = 0;
    while tried < 120 {
        let d = 1 + rng.below(2);
        let groups = 1 + rng.below(2);
        let cin = groups * (1 + rng.below(2));
        let og = 1 + rng.below(2);
        let n = 1 + rng.below(2);
        let kernel: Vec<usize> = (0..d).map(|_| 1 + rng.below(3)).collect();
        let s: Vec<usize> = (0..d).map(|_| 1 + rng.below(3)).collect();
        let dil: Vec<usize> = (0..d).map(|_| 1 + rng.below(2)).collect();
        let pad: Vec<usize> = (0..d).map(|_| rng.below(3)).collect();
        let extra: Vec<usize> = (0..d).map(|i| rng.below(s[i].max(dil[i]))).collect();
        let spatial: Vec<usize> = (0..d).map(|_| 1 + rng.below(4)).collect();
        let fits = (0..d).all(|i| {
            (spatial[i] - 1) * s[i] + dil[i] * (kernel[i] - 1) + extra[i] + 1 > 2 * pad[i]
        });
        if !fits {
            continue;
        }
        tried += 1;
        let mut x_shape = vec![n, cin];
        x_shape.extend(&spatial);
        let mut w_shape = vec![cin, og];
        w_shape.extend(&kernel);
        let x = rng.values(x_shape.iter().product());
        let w = rng.values(w_shape.iter().product());
        let (want_shape, want) =
            conv_transpose_reference(&x_shape, &w_shape, &x, &w, &s, &pad, &extra, &dil, groups);
        let xt = Tensor::from_vec(x, x_shape.clone());
        let wt = Tensor::from_vec(w, w_shape.clone());
        let y = if d == 1 {
            conv_transpose1d(
                &xt,
                &wt,
                None,
                [s[0]],
                [pad[0]],
                [extra[0]],
                groups,
                [dil[0]],
            )
        } else {
            conv_transpose2d(
                &xt,
                &wt,
                None,
                [s[0], s[1]],
                [pad[0], pad[1]],
                [extra[0], extra[1]],
                groups,
                [dil[0], dil[1]],
            )
        }
        .unwrap_or_else(|e| panic!("case {tried}: {e}"));
        assert_eq!(y.shape(), &want_shape[..], "case {tried}: shape");
        assert_close64(
            &format!("transposed case {tried}"),
            &y.to_vec::<f64>().unwrap(),
            &want,
        );
    }
}

// ---- A plain evaluator, from PyTorch's documented formulas ----

/// A deterministic generator of small integers and values.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn values(&mut self, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0)
            .collect()
    }
}

/// Every index of `shape`, last dimension fastest.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![vec![]];
    for &n in shape {
        out = out
            .into_iter()
            .flat_map(|p| {
                (0..n).map(move |i| {
                    let mut q = p.clone();
                    q.push(i);
                    q
                })
            })
            .collect();
    }
    out
}

fn flat(shape: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &n)| acc * n + i)
}

struct ConvCase {
    x_shape: Vec<usize>,
    w_shape: Vec<usize>,
    stride: Vec<usize>,
    pads: Vec<(usize, usize)>,
    dilation: Vec<usize>,
    groups: usize,
}

/// The convolution by its definition: `y[n, o, p] = b[o] + Σ_{c, q} x[n, g·C/G + c,
/// p·s + q·d - pad] · w[o, c, q]`, terms outside the input being zero.
fn conv_reference(
    case: &ConvCase,
    x: &[f64],
    w: &[f64],
    b: Option<&[f64]>,
) -> (Vec<usize>, Vec<f64>) {
    let d = case.stride.len();
    let (n, c) = (case.x_shape[0], case.x_shape[1]);
    let oc = case.w_shape[0];
    let cg = c / case.groups;
    let og = oc / case.groups;
    let kernel = &case.w_shape[2..];
    let out: Vec<usize> = (0..d)
        .map(|i| {
            let padded = case.x_shape[2 + i] + case.pads[i].0 + case.pads[i].1;
            (padded - case.dilation[i] * (kernel[i] - 1) - 1) / case.stride[i] + 1
        })
        .collect();
    let mut y_shape = vec![n, oc];
    y_shape.extend(&out);
    let y = indices(&y_shape)
        .into_iter()
        .map(|yi| {
            let (bn, o, p) = (yi[0], yi[1], &yi[2..]);
            let g = o / og;
            let mut acc = b.map_or(0.0, |b| b[o]);
            for ci in 0..cg {
                for q in indices(kernel) {
                    let mut xi = vec![bn, g * cg + ci];
                    let mut inside = true;
                    for i in 0..d {
                        let pos = (p[i] * case.stride[i] + q[i] * case.dilation[i]) as isize
                            - case.pads[i].0 as isize;
                        inside &= pos >= 0 && (pos as usize) < case.x_shape[2 + i];
                        xi.push(pos.max(0) as usize);
                    }
                    if inside {
                        let mut wi = vec![o, ci];
                        wi.extend(&q);
                        acc += x[flat(&case.x_shape, &xi)] * w[flat(&case.w_shape, &wi)];
                    }
                }
            }
            acc
        })
        .collect();
    (y_shape, y)
}

fn assert_close64(name: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
            "{name}[{i}]: kiln {g}, reference {w}"
        );
    }
}

#[test]
fn random_convolutions_match_the_definition() {
    let mut rng = Rng(0x5EED_C0DE);
    for case_no in 0..160 {
        let d = [1, 2, 2, 2, 3][rng.below(5)];
        let groups = 1 + rng.below(3);
        let cin = groups * (1 + rng.below(2));
        let oc = groups * (1 + rng.below(2));
        let n = rng.below(3);
        let kernel: Vec<usize> = (0..d)
            .map(|_| 1 + rng.below(if d == 3 { 2 } else { 3 }))
            .collect();
        let dilation: Vec<usize> = (0..d).map(|_| 1 + rng.below(2)).collect();
        let same = rng.below(5) == 0;
        let stride: Vec<usize> = if same {
            vec![1; d]
        } else {
            (0..d).map(|_| 1 + rng.below(3)).collect()
        };
        let pads: Vec<(usize, usize)> = (0..d)
            .map(|i| {
                if same {
                    let total = dilation[i] * (kernel[i] - 1);
                    (total / 2, total - total / 2)
                } else {
                    let p = rng.below(3);
                    (p, p)
                }
            })
            .collect();
        let spatial: Vec<usize> = (0..d)
            .map(|i| {
                let eff = dilation[i] * (kernel[i] - 1) + 1;
                (eff + rng.below(4)).saturating_sub(2 * pads[i].0).max(1)
            })
            .collect();
        let mut x_shape = vec![n, cin];
        x_shape.extend(&spatial);
        let mut w_shape = vec![oc, cin / groups];
        w_shape.extend(&kernel);
        let case = ConvCase {
            x_shape: x_shape.clone(),
            w_shape: w_shape.clone(),
            stride: stride.clone(),
            pads: pads.clone(),
            dilation: dilation.clone(),
            groups,
        };
        let x = rng.values(x_shape.iter().product());
        let w = rng.values(w_shape.iter().product());
        let b = rng.values(oc);
        let with_bias = rng.below(2) == 0;
        let (want_shape, want) = conv_reference(&case, &x, &w, with_bias.then_some(&b[..]));
        // Half the cases read the input through a transposed view of the same values.
        let xt = if rng.below(2) == 0 && d >= 2 {
            let mut swapped = x_shape.clone();
            swapped.swap(2, 3);
            let mut moved = vec![0.0; x.len()];
            for idx in indices(&x_shape) {
                let mut j = idx.clone();
                j.swap(2, 3);
                moved[flat(&swapped, &j)] = x[flat(&x_shape, &idx)];
            }
            Tensor::from_vec(moved, swapped).transpose(2, 3)
        } else {
            Tensor::from_vec(x.clone(), x_shape.clone())
        };
        let wt = Tensor::from_vec(w.clone(), w_shape.clone());
        let bt = Tensor::from_vec(b.clone(), [oc]);
        let bias = with_bias.then_some(&bt);
        let padding: Vec<usize> = pads.iter().map(|p| p.0).collect();
        let y = match d {
            1 => {
                let p = if same {
                    ConvPadding::Same
                } else {
                    ConvPadding::Explicit([padding[0]])
                };
                conv1d(&xt, &wt, bias, [stride[0]], p, [dilation[0]], groups)
            }
            2 => {
                let p = if same {
                    ConvPadding::Same
                } else {
                    ConvPadding::Explicit([padding[0], padding[1]])
                };
                conv2d(
                    &xt,
                    &wt,
                    bias,
                    [stride[0], stride[1]],
                    p,
                    [dilation[0], dilation[1]],
                    groups,
                )
            }
            _ => {
                let p = if same {
                    ConvPadding::Same
                } else {
                    ConvPadding::Explicit([padding[0], padding[1], padding[2]])
                };
                conv3d(
                    &xt,
                    &wt,
                    bias,
                    [stride[0], stride[1], stride[2]],
                    p,
                    [dilation[0], dilation[1], dilation[2]],
                    groups,
                )
            }
        }
        .unwrap_or_else(|e| panic!("case {case_no}: {e}"));
        assert_eq!(y.shape(), &want_shape[..], "case {case_no}: shape");
        assert_close64(
            &format!("case {case_no}"),
            &y.to_vec::<f64>().unwrap(),
            &want,
        );
    }
}

/// PyTorch's pooled length (`pooling_output_shape`).
fn pooled(len: usize, k_eff: usize, s: usize, p: usize, ceil: bool) -> usize {
    let span = len + 2 * p - k_eff;
    let mut o = if ceil { span.div_ceil(s) } else { span / s } + 1;
    if ceil && (o - 1) * s >= len + p {
        o -= 1;
    }
    o
}

#[test]
fn random_pools_match_pytorchs_loops() {
    let mut rng = Rng(0xB00C_5EED);
    for case_no in 0..200 {
        let (n, c) = (1 + rng.below(2), 1 + rng.below(3));
        let k = [1 + rng.below(3), 1 + rng.below(4)];
        let s = [1 + rng.below(3), 1 + rng.below(3)];
        let dil = [1 + rng.below(2), 1 + rng.below(2)];
        let ceil = rng.below(2) == 0;
        let is_max = rng.below(2) == 0;
        let eff: [usize; 2] = if is_max {
            [dil[0] * (k[0] - 1) + 1, dil[1] * (k[1] - 1) + 1]
        } else {
            k
        };
        let p = [rng.below(eff[0] / 2 + 1), rng.below(eff[1] / 2 + 1)];
        let hw = [eff[0] + rng.below(5), eff[1] + rng.below(5)];
        let shape = [n, c, hw[0], hw[1]];
        let mut x = rng.values(shape.iter().product());
        if rng.below(3) == 0 {
            // Ties, NaNs and -inf, for the max pools' tie and NaN rules.
            for v in x.iter_mut() {
                *v = match rng.below(12) {
                    0 => f64::NAN,
                    1 => f64::NEG_INFINITY,
                    _ => (*v * 2.0).round() / 2.0,
                };
            }
        }
        let xt = Tensor::from_vec(x.clone(), shape);
        let out = [
            pooled(hw[0], eff[0], s[0], p[0], ceil),
            pooled(hw[1], eff[1], s[1], p[1], ceil),
        ];
        let windows = |oh: usize, ow: usize| {
            // The window's real elements, in PyTorch's scan order.
            let mut v = vec![];
            for i in 0..k[0] {
                for j in 0..k[1] {
                    let (d0, d1) = if is_max { (dil[0], dil[1]) } else { (1, 1) };
                    let h = (oh * s[0] + i * d0) as isize - p[0] as isize;
                    let w = (ow * s[1] + j * d1) as isize - p[1] as isize;
                    if h >= 0 && w >= 0 && (h as usize) < hw[0] && (w as usize) < hw[1] {
                        v.push((h as usize, w as usize));
                    }
                }
            }
            v
        };
        if is_max {
            // PyTorch's CPU loop: start at the window's first element inside the input
            // with -inf, and take a value that is larger or NaN.
            let kept: Vec<(f64, i64)> = indices(&[n, c, out[0], out[1]])
                .into_iter()
                .map(|i| {
                    let cells = windows(i[2], i[3]);
                    let (h, w) = cells[0];
                    let mut best = (f64::NEG_INFINITY, (h * hw[1] + w) as i64);
                    for (h, w) in cells {
                        let v = x[flat(&shape, &[i[0], i[1], h, w])];
                        if v > best.0 || v.is_nan() {
                            best = (v, (h * hw[1] + w) as i64);
                        }
                    }
                    best
                })
                .collect();
            let leaf = xt.detach().requires_grad_(true);
            let (y, at) = max_pool2d_with_indices(&leaf, k, s, p, dil, ceil)
                .unwrap_or_else(|e| panic!("case {case_no}: {e}"));
            assert_eq!(y.shape(), &[n, c, out[0], out[1]], "case {case_no}");
            let got = y.to_vec::<f64>().unwrap();
            for (j, (g, (v, _))) in got.iter().zip(&kept).enumerate() {
                assert!(
                    g == v || (g.is_nan() && v.is_nan()),
                    "max case {case_no}[{j}]: kiln {g}, PyTorch's loop {v}"
                );
            }
            let want_at: Vec<i64> = kept.iter().map(|k| k.1).collect();
            assert_eq!(at.to_vec::<i64>().unwrap(), want_at, "max case {case_no}");
            let plain = max_pool2d(&xt, k, s, p, dil, ceil)
                .unwrap()
                .to_vec::<f64>()
                .unwrap();
            assert_eq!(
                plain.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "max case {case_no}: with and without indices"
            );
            // The gradient of Σ y·u reaches the kept element of each window alone.
            let u: Vec<f64> = (0..y.numel()).map(|j| 1.0 + j as f64).collect();
            (&y * Tensor::from_vec(u.clone(), y.shape()))
                .sum(..)
                .backward()
                .unwrap();
            let plane = hw[0] * hw[1];
            let mut want_dx = vec![0.0; x.len()];
            for (j, &a) in want_at.iter().enumerate() {
                let nc = j / (out[0] * out[1]);
                want_dx[nc * plane + a as usize] += u[j];
            }
            assert_eq!(
                leaf.grad().unwrap().to_vec::<f64>().unwrap(),
                want_dx,
                "max case {case_no}: gradient"
            );
            // Unpooling to the input's size (where PyTorch allows that size) writes each
            // value back at its index, the last of equal indices winning.
            let default = |d: usize| (out[d] - 1) * s[d] + k[d];
            // PyTorch takes a size strictly within a stride of the default.
            let fits = (0..2).all(|d| hw[d] + s[d] > default(d) && hw[d] < default(d) + s[d]);
            if fits && p == [0, 0] {
                let back = max_unpool2d(&y, &at, k, s, p, Some(hw.into())).unwrap();
                let mut want = vec![0.0; x.len()];
                for (j, &a) in want_at.iter().enumerate() {
                    let nc = j / (out[0] * out[1]);
                    want[nc * plane + a as usize] = kept[j].0;
                }
                let got = back.to_vec::<f64>().unwrap();
                assert_eq!(back.shape(), &shape, "unpool case {case_no}");
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g == w || (g.is_nan() && w.is_nan()),
                        "unpool case {case_no}[{j}]: kiln {g}, reference {w}"
                    );
                }
            }
        } else {
            let include = rng.below(2) == 0;
            let over = (rng.below(4) == 0).then(|| 1 + rng.below(5));
            let y = avg_pool2d(&xt, k, s, p, ceil, include, over)
                .unwrap_or_else(|e| panic!("case {case_no}: {e}"));
            assert_eq!(y.shape(), &[n, c, out[0], out[1]], "case {case_no}");
            let want: Vec<f64> = indices(&[n, c, out[0], out[1]])
                .into_iter()
                .map(|i| {
                    let sum: f64 = windows(i[2], i[3])
                        .into_iter()
                        .map(|(h, w)| x[flat(&shape, &[i[0], i[1], h, w])])
                        .sum();
                    // PyTorch's avg_pool2d divisor.
                    let (h0, w0) = (
                        (i[2] * s[0]) as isize - p[0] as isize,
                        (i[3] * s[1]) as isize - p[1] as isize,
                    );
                    let h1 = (h0 + k[0] as isize).min((hw[0] + p[0]) as isize);
                    let w1 = (w0 + k[1] as isize).min((hw[1] + p[1]) as isize);
                    let pool = (h1 - h0) * (w1 - w0);
                    let clipped =
                        (h1.min(hw[0] as isize) - h0.max(0)) * (w1.min(hw[1] as isize) - w0.max(0));
                    let divisor = match over {
                        Some(d) => d as isize,
                        None if include => pool,
                        None => clipped,
                    };
                    sum / divisor as f64
                })
                .collect();
            assert_close64(
                &format!("avg case {case_no}"),
                &y.to_vec::<f64>().unwrap(),
                &want,
            );
        }
        // Adaptive pooling to a random size, from PyTorch's cell bounds.
        let o = [1 + rng.below(hw[0]), 1 + rng.below(hw[1])];
        let y = adaptive_avg_pool2d(&xt, o).unwrap();
        let want: Vec<f64> = indices(&[n, c, o[0], o[1]])
            .into_iter()
            .map(|i| {
                let (h0, h1) = (i[2] * hw[0] / o[0], ((i[2] + 1) * hw[0]).div_ceil(o[0]));
                let (w0, w1) = (i[3] * hw[1] / o[1], ((i[3] + 1) * hw[1]).div_ceil(o[1]));
                let mut sum = 0.0;
                for h in h0..h1 {
                    for w in w0..w1 {
                        sum += x[flat(&shape, &[i[0], i[1], h, w])];
                    }
                }
                sum / ((h1 - h0) * (w1 - w0)) as f64
            })
            .collect();
        assert_eq!(y.shape(), &[n, c, o[0], o[1]]);
        for (g, w) in y.to_vec::<f64>().unwrap().iter().zip(&want) {
            assert!(
                g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-12,
                "adaptive case {case_no}: {g} vs {w}"
            );
        }
        // Adaptive max pooling to the same size: each cell's first largest element in
        // row-major order, or its last NaN (PyTorch's loop keeps a strictly larger value
        // or a NaN), and its flat index in the plane.
        let (ym, at) = adaptive_max_pool2d_with_indices(&xt, o).unwrap();
        let (want_v, want_i): (Vec<f64>, Vec<i64>) = indices(&[n, c, o[0], o[1]])
            .into_iter()
            .map(|i| {
                let (h0, h1) = (i[2] * hw[0] / o[0], ((i[2] + 1) * hw[0]).div_ceil(o[0]));
                let (w0, w1) = (i[3] * hw[1] / o[1], ((i[3] + 1) * hw[1]).div_ceil(o[1]));
                let mut best = (f64::NEG_INFINITY, -1i64);
                for h in h0..h1 {
                    for w in w0..w1 {
                        let v = x[flat(&shape, &[i[0], i[1], h, w])];
                        if best.1 < 0 || v > best.0 || v.is_nan() {
                            best = (v, (h * hw[1] + w) as i64);
                        }
                    }
                }
                best
            })
            .unzip();
        assert_eq!(
            ym.to_vec::<f64>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            want_v.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "adaptive max case {case_no}"
        );
        assert_eq!(
            at.to_vec::<i64>().unwrap(),
            want_i,
            "adaptive max case {case_no}"
        );
    }
}

#[test]
fn half_precision_and_an_empty_batch_work() {
    let x = Tensor::from_vec(sines(2 * 3 * 6 * 6, 0.7, 0.3), [2, 3, 6, 6]);
    let w = Tensor::from_vec(sines(4 * 3 * 3 * 3, 1.3, -0.2), [4, 3, 3, 3]);
    let full = conv2d(&x, &w, None, 1, 1, 1, 1)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for dt in [DType::F16, DType::BF16] {
        let y = conv2d(&x.cast(dt), &w.cast(dt), None, 1, 1, 1, 1).unwrap();
        assert_eq!(y.dtype(), dt);
        let tol = if dt == DType::F16 { 2e-2 } else { 1e-1 };
        for (g, f) in y.to_vec::<f32>().unwrap().iter().zip(&full) {
            assert!((g - f).abs() <= tol * (1.0 + f.abs()), "{dt:?}: {g} vs {f}");
        }
        let m = max_pool2d(&x.cast(dt), 2, 2, 0, 1, false).unwrap();
        assert_eq!(m.dtype(), dt);
    }
    let empty = Tensor::zeros([0, 3, 6, 6]);
    let y = conv2d(&empty, &w, None, 2, 1, 1, 1).unwrap();
    assert_eq!(y.shape(), &[0, 4, 3, 3]);
    assert!(y.to_vec::<f32>().unwrap().is_empty());
}

#[test]
fn bad_arguments_are_refused_when_recorded_with_the_shapes() {
    let x = Tensor::zeros([1, 3, 8, 8]);
    let msg = |e: KilnError| e.to_string();
    // Channels that do not match the weight.
    let e = conv2d(&x, &Tensor::zeros([4, 2, 3, 3]), None, 1, 0, 1, 1).unwrap_err();
    assert!(
        matches!(e, KilnError::ShapeMismatch { op: "conv2d", .. }),
        "{e}"
    );
    assert!(msg(e).contains("[4, 2, 3, 3]"));
    // Output channels not a multiple of groups.
    let e = conv2d(&x, &Tensor::zeros([4, 1, 3, 3]), None, 1, 0, 1, 3).unwrap_err();
    assert!(matches!(e, KilnError::ShapeMismatch { .. }), "{e}");
    // A kernel larger than the padded input.
    let e = conv2d(&x, &Tensor::zeros([1, 3, 9, 9]), None, 1, 0, 1, 1).unwrap_err();
    assert!(msg(e).contains("larger than the padded input"));
    // Dtypes, ranks, biases, strides, 'same' with a stride.
    let e = conv2d(
        &x,
        &Tensor::zeros([1, 3, 3, 3]).cast(DType::F64),
        None,
        1,
        0,
        1,
        1,
    )
    .unwrap_err();
    assert!(
        matches!(e, KilnError::DTypeMismatch { op: "conv2d", .. }),
        "{e}"
    );
    let e = conv2d(
        &Tensor::zeros([8, 8]),
        &Tensor::zeros([1, 1, 3, 3]),
        None,
        1,
        0,
        1,
        1,
    )
    .unwrap_err();
    assert!(msg(e).contains("3 or 4 dimensions"));
    let e = conv2d(
        &x,
        &Tensor::zeros([2, 3, 3, 3]),
        Some(&Tensor::zeros([3])),
        1,
        0,
        1,
        1,
    )
    .unwrap_err();
    assert!(msg(e).contains("one per output channel"));
    let e = conv2d(&x, &Tensor::zeros([2, 3, 3, 3]), None, 0, 0, 1, 1).unwrap_err();
    assert!(msg(e).contains("stride"));
    let e = conv2d(
        &x,
        &Tensor::zeros([2, 3, 3, 3]),
        None,
        2,
        ConvPadding::Same,
        1,
        1,
    )
    .unwrap_err();
    assert!(msg(e).contains("'same'"));
    let e = conv2d(
        &x.cast(DType::I64),
        &Tensor::zeros([2, 3, 3, 3]).cast(DType::I64),
        None,
        1,
        0,
        1,
        1,
    )
    .unwrap_err();
    assert!(matches!(e, KilnError::UnsupportedDType { .. }), "{e}");
    // Pooling: padding over half the window, windows larger than the input, zero output.
    let e = max_pool2d(&x, 3, 1, 2, 1, false).unwrap_err();
    assert!(msg(e).contains("at most half"));
    let e = avg_pool2d(&x, 2, 2, 2, false, true, None).unwrap_err();
    assert!(msg(e).contains("at most half"));
    let e = max_pool2d(&x, 9, 1, 0, 1, false).unwrap_err();
    assert!(msg(e).contains("larger than the padded input"));
    let e = avg_pool2d(&x, 2, 2, 0, false, true, Some(0)).unwrap_err();
    assert!(msg(e).contains("divisor_override"));
    let e = adaptive_avg_pool2d(&x, (0, 2)).unwrap_err();
    assert!(msg(e).contains("output_size"));
    // Modules check their channels against groups.
    assert!(
        Conv2d::with_options(
            3,
            4,
            3,
            ConvOptions {
                groups: 2,
                ..Default::default()
            },
            0
        )
        .is_err()
    );
}

#[test]
fn conv2d_module_has_pytorchs_parameters_and_initialization() {
    let conv = Conv2d::with_options(
        4,
        6,
        (3, 2),
        ConvOptions {
            groups: 2,
            padding: 1.into(),
            ..Default::default()
        },
        7,
    )
    .unwrap();
    let names: Vec<String> = conv
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["weight", "bias"]);
    assert_eq!(conv.weight.shape(), &[6, 2, 3, 2]);
    // PyTorch's bound 1/sqrt(fan_in), fan_in = 2 channels · 3 · 2 taps.
    let bound = 1.0 / 12f32.sqrt();
    let w = conv.weight.to_vec::<f32>().unwrap();
    assert!(w.iter().all(|v| v.abs() <= bound));
    assert!(
        w.iter().any(|v| v.abs() > bound * 0.8),
        "spread over the range"
    );
    assert!(conv.bias.as_ref().unwrap().requires_grad());
    let y = conv.forward(&Tensor::ones([2, 4, 5, 5])).unwrap();
    assert_eq!(y.shape(), &[2, 6, 5, 6]);
    let no_bias = Conv2d::with_options(
        4,
        6,
        3,
        ConvOptions {
            bias: false,
            ..Default::default()
        },
        7,
    )
    .unwrap();
    assert_eq!(no_bias.parameters().len(), 1);
}

#[test]
fn a_small_cnn_learns_to_separate_two_patterns() {
    // Vertical against horizontal bars at random places, 8×8: a conv, ReLU, pool, linear
    // classifier trained by SGD must drive its loss well below chance.
    let mut rng = Rng(42);
    let (count, side) = (64usize, 8usize);
    let mut images = vec![0.0f32; count * side * side];
    let mut labels = vec![0i64; count];
    for i in 0..count {
        let vertical = i % 2 == 0;
        let at = 1 + rng.below(side - 2);
        for t in 0..side {
            let (r, c) = if vertical { (t, at) } else { (at, t) };
            images[i * side * side + r * side + c] = 1.0;
        }
        labels[i] = i64::from(vertical);
    }
    let x = Tensor::from_vec(images, [count, 1, side, side]);
    let y = Tensor::from_vec(labels, [count]);
    let model = Sequential::new()
        .push(
            Conv2d::with_options(
                1,
                4,
                3,
                ConvOptions {
                    padding: 1.into(),
                    ..Default::default()
                },
                1,
            )
            .unwrap(),
        )
        .push(Relu)
        .push(MaxPool2d::new(2))
        .push(AvgPool2d::new(2))
        .push(AdaptiveAvgPool2d::new(2))
        .push(Flatten::new())
        .push(Linear::new(16, 2, true, 2).unwrap());
    let params = model.parameters();
    let mut opt = kiln::optim::Sgd::with_momentum(params, 0.5, 0.9, 0.0, false).unwrap();
    let loss_at = || {
        let logits = model.forward(&x).unwrap();
        kiln::nn::functional::cross_entropy(&logits, &y).unwrap()
    };
    let first = loss_at().item::<f32>().unwrap();
    for _ in 0..60 {
        model.zero_grad();
        let loss = loss_at();
        loss.backward().unwrap();
        opt.step().unwrap();
    }
    let last = loss_at().item::<f32>().unwrap();
    assert!(
        (first - std::f32::consts::LN_2).abs() < 0.2,
        "starts near chance: {first}"
    );
    assert!(last < 0.1, "loss {first} -> {last}");
}

/// Adaptive max pooling: hand values with ties (the first largest in row-major order wins
/// and takes the gradient), overlapping cells, a NaN cell, 1-d and unbatched input, the
/// module, and the errors.
#[test]
fn adaptive_max_pool_picks_the_first_largest_element() {
    // A 3 × 3 plane of ties pooled to 2 × 2: cells rows 0..2 / 1..3, columns 0..2 / 1..3.
    let x = Tensor::from_vec(
        vec![1.0f32, 5.0, 5.0, 5.0, 2.0, 0.0, 3.0, 5.0, 4.0],
        [1, 1, 3, 3],
    )
    .requires_grad_(true);
    let (y, at) = adaptive_max_pool2d_with_indices(&x, 2).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.0, 5.0, 5.0, 5.0]);
    assert_eq!(at.to_vec::<i64>().unwrap(), vec![1, 1, 3, 7]);
    y.sum(..).backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    );
    // 1-d, unbatched [C, L], with a NaN in the second cell.
    // Cells 0..3 and 2..5.
    let v = Tensor::from_vec(vec![0.5f32, 2.0, 1.0, f32::NAN, -1.0], [1, 5]);
    let y = adaptive_max_pool1d(&v, 2).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(y[0], 2.0);
    assert!(y[1].is_nan());
    // The module, and pooling to the input's own size is the identity.
    let m = kiln::nn::AdaptiveMaxPool2d::new((3, 3));
    assert_eq!(
        m.forward(&x.detach()).unwrap().to_vec::<f32>().unwrap(),
        x.detach().to_vec::<f32>().unwrap()
    );
    assert_eq!(
        adaptive_max_pool2d(&x.detach(), 1).unwrap().shape(),
        &[1, 1, 1, 1]
    );
    // Errors: a zero output size, an empty plane, an integer input.
    assert!(adaptive_max_pool2d(&x, (0, 2)).is_err());
    assert!(adaptive_max_pool2d(&Tensor::zeros([1, 1, 0, 3]), 1).is_err());
    let e = adaptive_max_pool1d(&Tensor::from_vec(vec![1i64, 2], [1, 2]), 1).unwrap_err();
    assert!(matches!(e, KilnError::UnsupportedDType { .. }), "{e}");
}

#[test]
fn max_pool_indices_follow_pytorchs_loop_and_unpool_puts_values_back() {
    // Windows [1 5 / 3 4] and [2 0 / 8 6]: flat indices 1 and 6 of the 2 × 4 plane.
    let x = Tensor::from_vec(
        vec![1.0f32, 5.0, 2.0, 0.0, 3.0, 4.0, 8.0, 6.0],
        [1, 1, 2, 4],
    );
    let (y, at) = max_pool2d_with_indices(&x, 2, 2, 0, 1, false).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![5.0, 8.0]);
    assert_eq!(at.to_vec::<i64>().unwrap(), vec![1, 6]);
    let back = max_unpool2d(&y, &at, 2, 2, 0, None).unwrap();
    assert_eq!(
        back.to_vec::<f32>().unwrap(),
        vec![0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 8.0, 0.0]
    );
    // A larger output size within a stride of the default: the same places in a 3 × 5 plane.
    let wide = max_unpool2d(&y, &at, 2, 2, 0, Some((3, 5).into())).unwrap();
    assert_eq!(wide.shape(), &[1, 1, 3, 5]);
    assert_eq!(wide.to_vec::<f32>().unwrap()[1], 5.0);
    assert_eq!(wide.to_vec::<f32>().unwrap()[6], 8.0);
    assert_eq!(wide.sum(..).item::<f32>().unwrap(), 13.0);

    // PyTorch's loop keeps the last NaN of a window (it takes `v > max || isnan(v)`), and
    // the gradient goes there. Unbatched [C, L].
    let v = Tensor::from_vec(vec![f32::NAN, 1.0, f32::NAN, 0.0], [1, 4]).requires_grad_(true);
    let (y, at) = max_pool1d_with_indices(&v, 4, 4, 0, 1, false).unwrap();
    assert!(y.to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(at.to_vec::<i64>().unwrap(), vec![2]);
    y.sum(..).backward().unwrap();
    assert_eq!(
        v.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 0.0, 1.0, 0.0]
    );

    // A -inf window that starts in the padding keeps its first element inside the input.
    let v = Tensor::from_vec(vec![f32::NEG_INFINITY, f32::NEG_INFINITY, 3.0], [1, 3])
        .requires_grad_(true);
    let (y, at) = max_pool1d_with_indices(&v, 3, 1, 1, 1, false).unwrap();
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![f32::NEG_INFINITY, 3.0, 3.0]
    );
    assert_eq!(at.to_vec::<i64>().unwrap(), vec![0, 2, 2]);
    let plain = max_pool1d(&v, 3, 1, 1, 1, false).unwrap();
    (&plain * Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [1, 3]))
        .sum(..)
        .backward()
        .unwrap();
    assert_eq!(
        v.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 0.0, 6.0]
    );
    let back = max_unpool1d(&y, &at, 3, 1, 1, None).unwrap();
    assert_eq!(
        back.to_vec::<f32>().unwrap(),
        vec![f32::NEG_INFINITY, 0.0, 3.0]
    );

    // The modules, and the gradient through unpooling.
    let x = Tensor::arange(0.0, 16.0, 1.0)
        .reshape([1, 1, 4, 4])
        .requires_grad_(true);
    let (y, at) = MaxPool2d::new(2).forward_with_indices(&x).unwrap();
    assert_eq!(at.to_vec::<i64>().unwrap(), vec![5, 7, 13, 15]);
    let back = MaxUnpool2d::new(2).forward(&y, &at).unwrap();
    assert_eq!(back.shape(), &[1, 1, 4, 4]);
    (&back * Tensor::arange(0.0, 16.0, 1.0).reshape([1, 1, 4, 4]))
        .sum(..)
        .backward()
        .unwrap();
    let g = x.grad().unwrap().to_vec::<f32>().unwrap();
    let mut want = vec![0.0f32; 16];
    for i in [5, 7, 13, 15] {
        want[i] = i as f32;
    }
    assert_eq!(g, want);
    let sized = MaxUnpool2d::new(2)
        .forward_with_size(&y, &at, (5, 5))
        .unwrap();
    assert_eq!(sized.shape(), &[1, 1, 5, 5]);

    // Errors: a size more than a stride from the default, i32 or misshapen indices when
    // recorded; an index outside the plane (or negative) when realized.
    let e = max_unpool2d(&y, &at, 2, 2, 0, Some((6, 4).into())).unwrap_err();
    assert!(max_unpool2d(&y, &at, 2, 2, 0, Some((2, 4).into())).is_err());
    assert!(max_unpool2d(&y, &at, 2, 2, 0, Some((3, 4).into())).is_ok());
    assert!(matches!(e, KilnError::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("max_unpool2d"), "{e}");
    let e = max_unpool2d(&y, &at.cast(DType::I32), 2, 2, 0, None).unwrap_err();
    assert!(matches!(e, KilnError::UnsupportedDType { .. }), "{e}");
    let e = max_unpool2d(&y, &at.reshape([1, 1, 4, 1]), 2, 2, 0, None).unwrap_err();
    assert!(matches!(e, KilnError::ShapeMismatch { .. }), "{e}");
    for bad in [16i64, -1] {
        let at = Tensor::from_vec(vec![5i64, 7, 13, bad], [1, 1, 2, 2]);
        let e = max_unpool2d(&y.detach(), &at, 2, 2, 0, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap_err();
        assert!(matches!(e, KilnError::IndexOutOfRange { .. }), "{bad}: {e}");
    }
}
