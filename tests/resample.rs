//! Padding modes, interpolation and pixel shuffling: PyTorch's documented examples by
//! hand, and random shapes, amounts, sizes and scales against plain per-element loops
//! written here from PyTorch's formulas (not separable, unlike kiln's, so the two paths
//! differ).

mod common;

use common::Rng;
use kiln::nn::functional::{
    InterpolationMode as M, PadMode, interpolate, pad, pixel_shuffle, pixel_unshuffle,
};
use kiln::nn::{Module, Pad, PixelShuffle, PixelUnshuffle, Upsample};
use kiln::{DType, KilnError, Tensor};

fn values(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0)
        .collect()
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{name}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{name}[{i}]: kiln {g}, reference {w}"
        );
    }
}

#[test]
fn pytorch_documented_upsampling() {
    // nn.Upsample's documented outputs for arange(1, 5).view(1, 1, 2, 2), scale 2.
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 2, 2]);
    let near = Upsample::scale(&[2.0]).forward(&x).unwrap();
    assert_eq!(
        near.to_vec::<f32>().unwrap(),
        vec![
            1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 3.0, 3.0, 4.0, 4.0
        ]
    );
    let bilinear = Upsample::scale(&[2.0])
        .mode(M::Bilinear)
        .forward(&x)
        .unwrap();
    let want = [
        1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0,
    ];
    assert_close("bilinear", &bilinear.to_vec::<f64>().unwrap(), &want, 1e-6);
    let corners = Upsample::scale(&[2.0])
        .mode(M::Bilinear)
        .align_corners(true)
        .forward(&x)
        .unwrap();
    let t = 1.0 / 3.0;
    let want = [
        1.0,
        1.0 + t,
        1.0 + 2.0 * t,
        2.0,
        1.0 + 2.0 * t,
        2.0,
        2.0 + t,
        2.0 + 2.0 * t,
        2.0 + t,
        2.0 + 2.0 * t,
        3.0,
        3.0 + t,
        3.0,
        3.0 + t,
        3.0 + 2.0 * t,
        4.0,
    ];
    assert_close(
        "align_corners",
        &corners.to_vec::<f64>().unwrap(),
        &want,
        1e-6,
    );
    // Reflection, replication and circular padding of [0, 1, 2, 3] by (2, 3).
    let v = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0], [1, 1, 4]);
    let row = |m: PadMode| pad(&v, &[2, 3], m, 0.0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(
        row(PadMode::Reflect),
        vec![2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 1.0, 0.0]
    );
    assert_eq!(
        row(PadMode::Replicate),
        vec![0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0]
    );
    assert_eq!(
        row(PadMode::Circular),
        vec![2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0]
    );
    // PixelShuffle's documented shapes.
    let s = PixelShuffle(3)
        .forward(&Tensor::ones([1, 9, 4, 4]))
        .unwrap();
    assert_eq!(s.shape(), &[1, 1, 12, 12]);
    let u = PixelUnshuffle(3)
        .forward(&Tensor::ones([1, 1, 12, 12]))
        .unwrap();
    assert_eq!(u.shape(), &[1, 9, 4, 4]);
}

/// PyTorch's padded source index of `i` (in `-before..n + after`), or `None` for a
/// constant border.
fn padded_source(mode: PadMode, i: i64, n: i64) -> Option<i64> {
    if (0..n).contains(&i) {
        return Some(i);
    }
    match mode {
        PadMode::Constant => None,
        PadMode::Reflect => Some(if i < 0 { -i } else { 2 * (n - 1) - i }),
        PadMode::Replicate => Some(i.clamp(0, n - 1)),
        PadMode::Circular => Some(((i % n) + n) % n),
    }
}

#[test]
fn random_padding_matches_the_definition() {
    let mut rng = Rng(0x9AD5);
    let modes = [
        PadMode::Constant,
        PadMode::Reflect,
        PadMode::Replicate,
        PadMode::Circular,
    ];
    for case in 0..200 {
        let mode = modes[rng.below(4)];
        let pairs = 1 + rng.below(3);
        let nd = pairs + 1 + rng.below(2);
        let shape: Vec<usize> = (0..nd).map(|_| 1 + rng.below(5)).collect();
        let mut amounts = vec![];
        for k in 0..pairs {
            let n = shape[nd - 1 - k] as i64;
            for _ in 0..2 {
                amounts.push(match mode {
                    PadMode::Reflect => rng.below(n as usize) as i64,
                    PadMode::Circular => rng.below(n as usize + 1) as i64,
                    PadMode::Replicate => rng.below(4) as i64,
                    PadMode::Constant => rng.below(4) as i64 - 1,
                });
            }
        }
        if mode == PadMode::Constant {
            // Crops may not remove a whole dimension.
            for k in 0..pairs {
                let n = shape[nd - 1 - k] as i64;
                let cut = (-amounts[2 * k]).max(0) + (-amounts[2 * k + 1]).max(0);
                if cut >= n {
                    amounts[2 * k] = 0;
                    amounts[2 * k + 1] = 0;
                }
            }
        }
        let x = values(&mut rng, shape.iter().product());
        // Half the cases pad a transposed view of the data.
        let base = Tensor::from_vec(x.clone(), shape.clone());
        let (xt, data_shape) = if rng.below(2) == 0 && nd >= 2 {
            let mut t_shape = shape.clone();
            t_shape.swap(nd - 1, nd - 2);
            let t = Tensor::from_vec(x.clone(), t_shape).transpose(-1, -2);
            (t, shape.clone())
        } else {
            (base, shape.clone())
        };
        let logical: Vec<f64> = xt.to_vec::<f64>().unwrap();
        let got = pad(&xt, &amounts, mode, 7.5)
            .unwrap_or_else(|e| panic!("case {case} {mode:?} {amounts:?} {shape:?}: {e}"));
        let mut out_shape = data_shape.clone();
        for k in 0..pairs {
            let d = nd - 1 - k;
            out_shape[d] = (shape[d] as i64 + amounts[2 * k] + amounts[2 * k + 1]) as usize;
        }
        assert_eq!(got.shape(), &out_shape, "case {case}");
        let st = strides(&data_shape);
        let want: Vec<f64> = (0..out_shape.iter().product())
            .map(|o| {
                let idx = unravel(o, &out_shape);
                let mut flat = 0usize;
                for d in 0..nd {
                    let k = nd - 1 - d;
                    let before = if k < pairs { amounts[2 * k] } else { 0 };
                    match padded_source(mode, idx[d] as i64 - before, shape[d] as i64) {
                        Some(s) => flat += s as usize * st[d],
                        None => return 7.5,
                    }
                }
                logical[flat]
            })
            .collect();
        assert_eq!(
            got.to_vec::<f64>().unwrap(),
            want,
            "case {case}: {mode:?} {amounts:?} over {shape:?}"
        );
    }
}

/// PyTorch's (source, weight) taps of every output position along a dimension of `n`
/// resampled to `o`, from its kernels' formulas (the nearest modes in native f32, as
/// PyTorch computes them).
fn all_taps(
    mode: M,
    n: usize,
    o: usize,
    scale: Option<f64>,
    align: bool,
) -> Vec<Vec<(usize, f64)>> {
    let last = n as i64 - 1;
    let clampi = |v: i64| v.clamp(0, last) as usize;
    let area = if align {
        if o > 1 {
            (n as f64 - 1.0) / (o as f64 - 1.0)
        } else {
            0.0
        }
    } else {
        match scale {
            Some(s) => 1.0 / s,
            None => n as f64 / o as f64,
        }
    };
    (0..o)
        .map(|i| match mode {
            M::Nearest | M::NearestExact => {
                let r32 = match scale {
                    Some(s) => (1.0 / s) as f32,
                    None => n as f32 / o as f32,
                };
                let src = if mode == M::Nearest && n == o {
                    i as i64
                } else if mode == M::Nearest && o == 2 * n {
                    i as i64 / 2
                } else if mode == M::Nearest {
                    (i as f32 * r32).floor() as i64
                } else {
                    ((i as f32 + 0.5) * r32).floor() as i64
                };
                vec![(clampi(src), 1.0)]
            }
            M::Bicubic => {
                let src = if align {
                    area * i as f64
                } else {
                    area * (i as f64 + 0.5) - 0.5
                };
                let b = src.floor();
                let t = src - b;
                // Keys' cubic with a = -0.75 at distances 1 + t, t, 1 - t, 2 - t.
                let a = -0.75;
                let k = |d: f64| {
                    let d = d.abs();
                    if d <= 1.0 {
                        (a + 2.0) * d * d * d - (a + 3.0) * d * d + 1.0
                    } else {
                        a * d * d * d - 5.0 * a * d * d + 8.0 * a * d - 4.0 * a
                    }
                };
                (0..4)
                    .map(|j| (clampi(b as i64 - 1 + j), k(t + 1.0 - j as f64)))
                    .collect()
            }
            _ if n == o => vec![(i, 1.0)],
            _ => {
                let src = if align {
                    area * i as f64
                } else {
                    (area * (i as f64 + 0.5) - 0.5).max(0.0)
                };
                let i0 = (src.floor() as i64).min(last);
                let l1 = (src - i0 as f64).clamp(0.0, 1.0);
                vec![(i0 as usize, 1.0 - l1), (clampi(i0 + 1), l1)]
            }
        })
        .collect()
}

#[test]
fn random_interpolation_matches_pytorchs_formulas() {
    let mut rng = Rng(0x1A7E);
    let modes = [
        M::Nearest,
        M::NearestExact,
        M::Linear,
        M::Bilinear,
        M::Bicubic,
        M::Trilinear,
    ];
    for case in 0..150 {
        let mode = modes[rng.below(modes.len())];
        let dims = match mode {
            M::Linear => 1,
            M::Bilinear | M::Bicubic => 2,
            M::Trilinear => 3,
            _ => 1 + rng.below(3),
        };
        let mut shape = vec![1 + rng.below(2), 1 + rng.below(2)];
        shape.extend((0..dims).map(|_| 1 + rng.below(6)));
        let spatial = shape[2..].to_vec();
        let by_scale = rng.below(2) == 0;
        let scales: Vec<f64> = (0..dims)
            .map(|_| [0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0][rng.below(7)])
            .collect();
        let sizes: Vec<usize> = (0..dims).map(|_| 1 + rng.below(9)).collect();
        let out: Vec<usize> = if by_scale {
            spatial
                .iter()
                .zip(&scales)
                .map(|(&n, &s)| (n as f64 * s).floor() as usize)
                .collect()
        } else {
            sizes.clone()
        };
        if out.contains(&0) {
            continue;
        }
        let interpolating = !matches!(mode, M::Nearest | M::NearestExact);
        let align = interpolating && rng.below(2) == 0;
        let x = values(&mut rng, shape.iter().product());
        let xt = Tensor::from_vec(x.clone(), shape.clone());
        let got = interpolate(
            &xt,
            (!by_scale).then_some(&sizes[..]),
            by_scale.then_some(&scales[..]),
            mode,
            interpolating.then_some(align),
            false,
        )
        .unwrap_or_else(|e| panic!("case {case}: {e}"));
        let mut out_shape = shape[..2].to_vec();
        out_shape.extend_from_slice(&out);
        assert_eq!(got.shape(), &out_shape, "case {case}");
        let per_dim: Vec<_> = (0..dims)
            .map(|d| {
                all_taps(
                    mode,
                    spatial[d],
                    out[d],
                    by_scale.then_some(scales[d]),
                    align,
                )
            })
            .collect();
        let st = strides(&shape);
        let want: Vec<f64> = (0..out_shape.iter().product())
            .map(|o| {
                let idx = unravel(o, &out_shape);
                let base = idx[0] * st[0] + idx[1] * st[1];
                // Σ over every combination of one tap per dimension.
                let mut sum = 0.0;
                let counts: Vec<usize> = (0..dims).map(|d| per_dim[d][idx[2 + d]].len()).collect();
                for c in 0..counts.iter().product() {
                    let pick = unravel(c, &counts);
                    let (mut flat, mut w) = (base, 1.0);
                    for d in 0..dims {
                        let (s, wd) = per_dim[d][idx[2 + d]][pick[d]];
                        flat += s * st[2 + d];
                        w *= wd;
                    }
                    sum += w * x[flat];
                }
                sum
            })
            .collect();
        assert_close(
            &format!("case {case}: {mode:?} {shape:?} -> {out:?}, align {align}"),
            &got.to_vec::<f64>().unwrap(),
            &want,
            1e-12,
        );
        // f32 agrees within f32 rounding.
        let got32 = interpolate(
            &xt.cast(DType::F32),
            (!by_scale).then_some(&sizes[..]),
            by_scale.then_some(&scales[..]),
            mode,
            interpolating.then_some(align),
            false,
        )
        .unwrap();
        assert_close(
            &format!("case {case} f32"),
            &got32.to_vec::<f64>().unwrap(),
            &want,
            2e-5,
        );
    }
}

#[test]
fn area_mode_and_pixel_shuffle_and_errors() {
    // Area mode is adaptive average pooling.
    let x = Tensor::arange(0.0, 16.0, 1.0).reshape([1, 1, 4, 4]);
    let a = interpolate(&x, Some(&[2]), None, M::Area, None, false).unwrap();
    assert_eq!(a.to_vec::<f32>().unwrap(), vec![2.5, 4.5, 10.5, 12.5]);
    // pixel_shuffle against its definition, with a leading batch of two dimensions.
    let (r, c) = (2usize, 3usize);
    let shape = [2, 1, c * r * r, 2, 3];
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|v| v as f64).collect();
    let t = Tensor::from_vec(data.clone(), shape);
    let y = pixel_shuffle(&t, r).unwrap();
    assert_eq!(y.shape(), &[2, 1, c, 2 * r, 3 * r]);
    let got = y.to_vec::<f64>().unwrap();
    let st = strides(&shape);
    let ys = [2, 1, c, 2 * r, 3 * r];
    for (o, g) in got.iter().enumerate() {
        let i = unravel(o, &ys);
        let ch = i[2] * r * r + (i[3] % r) * r + (i[4] % r);
        let src =
            i[0] * st[0] + i[1] * st[1] + ch * st[2] + (i[3] / r) * st[3] + (i[4] / r) * st[4];
        assert_eq!(*g, data[src], "pixel_shuffle at {i:?}");
    }
    assert_eq!(
        pixel_unshuffle(&y, r).unwrap().to_vec::<f64>().unwrap(),
        data
    );
    // The gradient of a pixel shuffle is the unshuffle of the output gradient.
    let leaf = Tensor::from_vec(data.clone(), shape).requires_grad_(true);
    let w = Tensor::arange(0.0, n as f64, 1.0)
        .cast(DType::F64)
        .reshape(ys);
    (&pixel_shuffle(&leaf, r).unwrap() * &w)
        .sum(..)
        .backward()
        .unwrap();
    assert_eq!(
        leaf.grad().unwrap().to_vec::<f64>().unwrap(),
        pixel_unshuffle(&w, r).unwrap().to_vec::<f64>().unwrap()
    );
    // The Pad module and nearest resampling of integers.
    let p = Pad::replication(&[1, 1])
        .forward(&Tensor::ones([2, 3]))
        .unwrap();
    assert_eq!(p.shape(), &[2, 5]);
    let ints = Tensor::from_vec(vec![1i64, 2], [1, 1, 2]);
    let up = interpolate(&ints, Some(&[4]), None, M::Nearest, None, false).unwrap();
    assert_eq!(up.to_vec::<i64>().unwrap(), vec![1, 1, 2, 2]);

    // Errors, each naming what is wrong.
    let v = Tensor::ones([1, 1, 3]);
    let invalid = |r: kiln::Result<Tensor>| match r {
        Err(e @ KilnError::InvalidArgument { .. }) => e.to_string(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    assert!(invalid(pad(&v, &[3, 0], PadMode::Reflect, 0.0)).contains("below"));
    assert!(invalid(pad(&v, &[4, 0], PadMode::Circular, 0.0)).contains("at most"));
    assert!(invalid(pad(&v, &[1], PadMode::Constant, 0.0)).contains("pairs"));
    assert!(invalid(pad(&Tensor::ones([3]), &[1, 1], PadMode::Reflect, 0.0)).contains("trailing"));
    assert!(invalid(pad(&v, &[-2, -2], PadMode::Constant, 0.0)).contains("removes"));
    assert!(
        invalid(interpolate(
            &v,
            Some(&[4]),
            Some(&[2.0]),
            M::Nearest,
            None,
            false
        ))
        .contains("only one")
    );
    assert!(
        invalid(interpolate(
            &v,
            Some(&[4]),
            None,
            M::Nearest,
            Some(true),
            false
        ))
        .contains("align_corners")
    );
    assert!(
        invalid(interpolate(&v, Some(&[4]), None, M::Bilinear, None, false)).contains("bilinear")
    );
    assert!(invalid(interpolate(&v, Some(&[4, 4]), None, M::Linear, None, false)).contains("size"));
    assert!(
        invalid(interpolate(&v, None, Some(&[0.1]), M::Linear, None, false))
            .contains("greater than 0")
    );
    let e = interpolate(&ints, Some(&[4]), None, M::Linear, None, false).unwrap_err();
    assert!(matches!(e, KilnError::UnsupportedDType { .. }), "{e}");
    assert!(invalid(pixel_shuffle(&Tensor::ones([1, 3, 2, 2]), 2)).contains("divisible"));
    assert!(invalid(pixel_unshuffle(&Tensor::ones([1, 1, 3, 2]), 2)).contains("divisible"));
}
