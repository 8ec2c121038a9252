//! Sliding blocks (`unfold`/`fold`) and spatial sampling (`affine_grid`/`grid_sample`):
//! random shapes and options against plain f64 loops written here from PyTorch's
//! definitions (a direct sliding-window loop, a per-pixel col2im loop, a per-point
//! sampling loop over all taps at once), fold as unfold's adjoint, documented values,
//! errors, and central finite-difference gradient checks in f64.

mod common;
mod fd_helpers;

use common::Rng;
use fd_helpers::{assert_close, gradcheck, values};
use kiln::nn::functional::{
    GridSampleMode as GM, GridSamplePadding as GP, affine_grid, fold, grid_sample, unfold,
};
use kiln::nn::{Fold, Module, Unfold};
use kiln::{KilnError, Tensor};

/// The options of one sliding-block test case.
#[derive(Debug, Clone, Copy)]
struct Blocks {
    k: [usize; 2],
    d: [usize; 2],
    p: [usize; 2],
    s: [usize; 2],
}

impl Blocks {
    fn random(rng: &mut Rng) -> Blocks {
        let mut two = |lo: usize, n: usize| [lo + rng.below(n), lo + rng.below(n)];
        Blocks {
            k: two(1, 3),
            d: two(1, 2),
            p: two(0, 2),
            s: two(1, 3),
        }
    }

    fn out(&self, h: usize, w: usize) -> Option<[usize; 2]> {
        let one = |len: usize, i: usize| {
            let padded = len + 2 * self.p[i];
            let eff = self.d[i] * (self.k[i] - 1) + 1;
            (padded >= eff).then(|| (padded - eff) / self.s[i] + 1)
        };
        Some([one(h, 0)?, one(w, 1)?])
    }
}

/// PyTorch's im2col by its definition: `cols[n][(c·kh + i)·kw + j][oy·ow + ox]` is the
/// padded input at `(oy·s + i·d - p, ox·s + j·d - p)`.
fn unfold_ref(x: &[f64], shape: [usize; 4], b: Blocks) -> (Vec<f64>, [usize; 3]) {
    let [n, c, h, w] = shape;
    let [oh, ow] = b.out(h, w).unwrap();
    let rows = c * b.k[0] * b.k[1];
    let l = oh * ow;
    let mut out = vec![0.0; n * rows * l];
    for ni in 0..n {
        for ci in 0..c {
            for i in 0..b.k[0] {
                for j in 0..b.k[1] {
                    let row = (ci * b.k[0] + i) * b.k[1] + j;
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let y = (oy * b.s[0] + i * b.d[0]) as i64 - b.p[0] as i64;
                            let xx = (ox * b.s[1] + j * b.d[1]) as i64 - b.p[1] as i64;
                            if y >= 0 && xx >= 0 && (y as usize) < h && (xx as usize) < w {
                                out[(ni * rows + row) * l + oy * ow + ox] =
                                    x[((ni * c + ci) * h + y as usize) * w + xx as usize];
                            }
                        }
                    }
                }
            }
        }
    }
    (out, [n, rows, l])
}

/// col2im by its definition: every output pixel sums the column entries that name it.
fn fold_ref(cols: &[f64], n: usize, c: usize, size: [usize; 2], b: Blocks) -> Vec<f64> {
    let [h, w] = size;
    let [oh, ow] = b.out(h, w).unwrap();
    let rows = c * b.k[0] * b.k[1];
    let l = oh * ow;
    let mut out = vec![0.0; n * c * h * w];
    for ni in 0..n {
        for ci in 0..c {
            for y in 0..h {
                for xx in 0..w {
                    let mut acc = 0.0;
                    for i in 0..b.k[0] {
                        for j in 0..b.k[1] {
                            let ty = (y + b.p[0]) as i64 - (i * b.d[0]) as i64;
                            let tx = (xx + b.p[1]) as i64 - (j * b.d[1]) as i64;
                            if ty < 0 || tx < 0 {
                                continue;
                            }
                            let (ty, tx) = (ty as usize, tx as usize);
                            if ty % b.s[0] != 0 || tx % b.s[1] != 0 {
                                continue;
                            }
                            let (oy, ox) = (ty / b.s[0], tx / b.s[1]);
                            if oy < oh && ox < ow {
                                let row = (ci * b.k[0] + i) * b.k[1] + j;
                                acc += cols[(ni * rows + row) * l + oy * ow + ox];
                            }
                        }
                    }
                    out[((ni * c + ci) * h + y) * w + xx] = acc;
                }
            }
        }
    }
    out
}

#[test]
fn unfold_and_fold_match_the_definitions() {
    let mut rng = Rng(0x5eed_0f01d);
    let mut cases = 0;
    while cases < 40 {
        let b = Blocks::random(&mut rng);
        let (n, c, h, w) = (
            1 + rng.below(2),
            1 + rng.below(3),
            1 + rng.below(6),
            1 + rng.below(6),
        );
        let Some([oh, ow]) = b.out(h, w) else {
            continue;
        };
        cases += 1;
        let x = values(&mut rng, n * c * h * w, -2.0, 2.0);
        let (want, cshape) = unfold_ref(&x, [n, c, h, w], b);
        let xt = Tensor::from_vec(x.clone(), [n, c, h, w]);
        let got = unfold(&xt, b.k, b.d, b.p, b.s).unwrap();
        assert_eq!(got.shape(), &cshape, "{b:?}");
        assert_close("unfold", &got.to_vec::<f64>().unwrap(), &want, 1e-12);
        // Unbatched, through the module.
        let mut m = Unfold::new(b.k);
        (m.dilation, m.padding, m.stride) = (b.d.into(), b.p.into(), b.s.into());
        let single = m
            .forward(&Tensor::from_vec(x[..c * h * w].to_vec(), [c, h, w]))
            .unwrap();
        assert_eq!(single.shape(), &cshape[1..]);
        assert_close(
            "unfold unbatched",
            &single.to_vec::<f64>().unwrap(),
            &want[..cshape[1] * cshape[2]],
            1e-12,
        );

        // fold against its loop and as unfold's adjoint: <unfold(x), y> = <x, fold(y)>.
        let y = values(&mut rng, cshape.iter().product(), -2.0, 2.0);
        let yt = Tensor::from_vec(y.clone(), cshape);
        let folded = fold(&yt, [h, w], b.k, b.d, b.p, b.s).unwrap();
        assert_eq!(folded.shape(), &[n, c, h, w]);
        let fv = folded.to_vec::<f64>().unwrap();
        assert_close("fold", &fv, &fold_ref(&y, n, c, [h, w], b), 1e-12);
        let lhs: f64 = want.iter().zip(&y).map(|(a, b)| a * b).sum();
        let rhs: f64 = x.iter().zip(&fv).map(|(a, b)| a * b).sum();
        assert!(
            (lhs - rhs).abs() < 1e-9 * (1.0 + lhs.abs()),
            "adjoint {lhs} vs {rhs}"
        );
        let mut fm = Fold::new([h, w], b.k);
        fm.blocks = m;
        let rows = cshape[1];
        let single = fm
            .forward(&Tensor::from_vec(
                y[..rows * oh * ow].to_vec(),
                [rows, oh * ow],
            ))
            .unwrap();
        assert_eq!(single.shape(), &[c, h, w]);
        assert_close(
            "fold unbatched",
            &single.to_vec::<f64>().unwrap(),
            &fv[..c * h * w],
            1e-12,
        );
    }
}

#[test]
fn pytorch_documented_fold_and_unfold() {
    // nn.Unfold's doc: a [2, 5, 3, 4] input with kernel (2, 3) gives [2, 30, 4].
    let x = Tensor::rand_seeded([2, 5, 3, 4], 1);
    assert_eq!(
        Unfold::new((2, 3)).forward(&x).unwrap().shape(),
        &[2, 30, 4]
    );
    // nn.Fold's doc: [1, 3·2·2, 12] folded to (4, 5) with kernel (2, 2) is [1, 3, 4, 5].
    let cols = Tensor::rand_seeded([1, 12, 12], 2);
    assert_eq!(
        Fold::new((4, 5), (2, 2)).forward(&cols).unwrap().shape(),
        &[1, 3, 4, 5]
    );
    // fold(unfold(ones)) counts the blocks covering each pixel.
    let ones = Tensor::ones([1, 1, 3, 4]);
    let c = fold(&unfold(&ones, 2, 1, 0, 1).unwrap(), [3, 4], 2, 1, 0, 1).unwrap();
    assert_eq!(
        c.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 2.0, 1.0, 2.0, 4.0, 4.0, 2.0, 1.0, 2.0, 2.0, 1.0]
    );
}

#[test]
fn unfold_and_fold_errors() {
    let x = Tensor::ones([1, 2, 3, 3]);
    let bad = |r: Result<Tensor, KilnError>, what: &str| {
        let e = r.expect_err(what);
        assert!(
            matches!(e, KilnError::InvalidArgument { .. }),
            "{what}: {e:?}"
        );
    };
    bad(unfold(&x, 4, 1, 0, 1), "kernel larger than the input");
    bad(unfold(&x, 0, 1, 0, 1), "zero kernel");
    bad(unfold(&x, 2, 1, 0, 0), "zero stride");
    bad(unfold(&Tensor::ones([3, 3]), 2, 1, 0, 1), "2-D input");
    let cols = Tensor::ones([1, 8, 4]);
    bad(
        fold(&cols, [3, 3], 3, 1, 0, 1),
        "rows not divisible by the kernel",
    );
    bad(fold(&cols, [4, 4], 2, 1, 0, 1), "block count mismatch");
    bad(fold(&Tensor::ones([8]), [3, 3], 2, 1, 0, 1), "1-D columns");
    // A 4-D input unfolds with padding to 4 blocks per side.
    let p = unfold(&x, 3, 1, 1, 1).unwrap();
    assert_eq!(p.shape(), &[1, 18, 9]);
}

#[test]
fn unfold_and_fold_gradients() {
    let mut rng = Rng(77);
    let b = Blocks {
        k: [2, 2],
        d: [1, 2],
        p: [1, 0],
        s: [2, 1],
    };
    let (n, c, h, w) = (1, 2, 3, 4);
    let x = values(&mut rng, n * c * h * w, -1.0, 1.0);
    let [oh, ow] = b.out(h, w).unwrap();
    let rows = c * 4;
    let wts = values(&mut rng, rows * oh * ow, -1.0, 1.0);
    let wt = Tensor::from_vec(wts.clone(), [n, rows, oh * ow]);
    gradcheck(
        "unfold",
        &x,
        &[n, c, h, w],
        &|t| (&unfold(t, b.k, b.d, b.p, b.s).unwrap() * &wt).sum(..),
        1e-6,
    );
    let img = Tensor::from_vec(values(&mut rng, n * c * h * w, -1.0, 1.0), [n, c, h, w]);
    let y = values(&mut rng, rows * oh * ow, -1.0, 1.0);
    gradcheck(
        "fold",
        &y,
        &[n, rows, oh * ow],
        &|t| {
            let f = fold(t, [h, w], b.k, b.d, b.p, b.s).unwrap();
            (&(&f * &f) * &img).sum(..)
        },
        1e-6,
    );
}

// ---- grid_sample ------------------------------------------------------------------------

fn unnormalize(v: f64, len: usize, align: bool) -> f64 {
    if align {
        (v + 1.0) / 2.0 * (len as f64 - 1.0)
    } else {
        ((v + 1.0) * len as f64 - 1.0) / 2.0
    }
}

fn reflect_ref(v: f64, twice_low: i64, twice_high: i64) -> f64 {
    if twice_low == twice_high {
        return 0.0;
    }
    let min = twice_low as f64 / 2.0;
    let span = (twice_high - twice_low) as f64 / 2.0;
    let v = (v - min).abs();
    let extra = v % span;
    let flips = (v / span).floor() as i64;
    if flips % 2 == 0 {
        extra + min
    } else {
        span - extra + min
    }
}

/// PyTorch's `compute_coordinates`.
fn pad_ref(v: f64, len: usize, pad: GP, align: bool) -> f64 {
    let clip = |v: f64| v.clamp(0.0, len as f64 - 1.0);
    match pad {
        GP::Zeros => v,
        GP::Border => clip(v),
        GP::Reflection => {
            if align {
                clip(reflect_ref(v, 0, 2 * (len as i64 - 1)))
            } else {
                clip(reflect_ref(v, -1, 2 * len as i64 - 1))
            }
        }
    }
}

fn cubic_ref(t: f64) -> [f64; 4] {
    let a = -0.75;
    let c1 = |x: f64| ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    let c2 = |x: f64| ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)]
}

/// PyTorch's grid sampler, one output point at a time: every tap of every dimension
/// enumerated together (not one dimension after another).
fn grid_sample_ref(
    x: &[f64],
    shape: &[usize],
    grid: &[f64],
    gshape: &[usize],
    mode: GM,
    pad: GP,
    align: bool,
) -> Vec<f64> {
    let d = shape.len() - 2;
    let (n, c) = (shape[0], shape[1]);
    let sizes = &shape[2..];
    let plane: usize = sizes.iter().product();
    let points: usize = gshape[1..gshape.len() - 1].iter().product();
    let mut out = vec![0.0; n * c * points];
    for ni in 0..n {
        for p in 0..points {
            // Per dimension (outermost first): the (index, weight) taps.
            let mut taps: Vec<Vec<(f64, f64)>> = vec![];
            for (j, &len) in sizes.iter().enumerate() {
                let g = grid[(ni * points + p) * d + (d - 1 - j)];
                let u = unnormalize(g, len, align);
                taps.push(match mode {
                    GM::Nearest => vec![(pad_ref(u, len, pad, align).round_ties_even(), 1.0)],
                    GM::Bilinear => {
                        let v = pad_ref(u, len, pad, align);
                        let f = v.floor();
                        vec![(f, 1.0 - (v - f)), (f + 1.0, v - f)]
                    }
                    GM::Bicubic => {
                        let f = u.floor();
                        let w = cubic_ref(u - f);
                        (0..4)
                            .map(|k| (pad_ref(f - 1.0 + k as f64, len, pad, align), w[k]))
                            .collect()
                    }
                });
            }
            let count: usize = taps.iter().map(Vec::len).product();
            for ci in 0..c {
                let mut acc = 0.0;
                for combo in 0..count {
                    let mut rest = combo;
                    let mut flat = 0usize;
                    let mut weight = 1.0;
                    let mut inside = true;
                    for j in 0..d {
                        let (at, w) = taps[j][rest % taps[j].len()];
                        rest /= taps[j].len();
                        weight *= w;
                        let i = at as i64;
                        if i < 0 || i >= sizes[j] as i64 {
                            inside = false;
                        }
                        flat = flat * sizes[j] + i.max(0) as usize;
                    }
                    if inside {
                        acc += weight * x[(ni * c + ci) * plane + flat];
                    }
                }
                out[(ni * c + ci) * points + p] = acc;
            }
        }
    }
    out
}

const MODES: [GM; 3] = [GM::Bilinear, GM::Nearest, GM::Bicubic];
const PADS: [GP; 3] = [GP::Zeros, GP::Border, GP::Reflection];

#[test]
fn grid_sample_matches_pytorchs_sampler() {
    let mut rng = Rng(0x9a1d);
    for case in 0..54 {
        let mode = MODES[case % 3];
        let pad = PADS[(case / 3) % 3];
        let align = (case / 9) % 2 == 1;
        // 5-D input for bilinear and nearest every third round.
        let three = mode != GM::Bicubic && case % 4 == 3;
        let n = 1 + rng.below(2);
        let c = 1 + rng.below(3);
        let mut shape = vec![n, c];
        let mut gshape = vec![n];
        let d = if three { 3 } else { 2 };
        for _ in 0..d {
            shape.push(1 + rng.below(5));
            gshape.push(1 + rng.below(4));
        }
        gshape.push(d);
        let x = values(&mut rng, shape.iter().product(), -2.0, 2.0);
        // Points well outside the input too, to exercise the padding.
        let g = values(&mut rng, gshape.iter().product(), -2.5, 2.5);
        let want = grid_sample_ref(&x, &shape, &g, &gshape, mode, pad, align);
        let got = grid_sample(
            &Tensor::from_vec(x, shape.as_slice()),
            &Tensor::from_vec(g, gshape.as_slice()),
            mode,
            pad,
            align,
        )
        .unwrap();
        let mut oshape = vec![n, c];
        oshape.extend_from_slice(&gshape[1..=d]);
        assert_eq!(got.shape(), oshape.as_slice());
        assert_close(
            &format!("grid_sample {mode:?} {pad:?} align={align} {shape:?}"),
            &got.to_vec::<f64>().unwrap(),
            &want,
            1e-10,
        );
    }
    // f32 against the same loop.
    let x: Vec<f64> = (0..2 * 3 * 4).map(|i| i as f64 * 0.25).collect();
    let g = values(&mut rng, 2 * 5 * 2, -1.2, 1.2);
    let want = grid_sample_ref(
        &x,
        &[2, 1, 3, 4],
        &g,
        &[2, 5, 1, 2],
        GM::Bicubic,
        GP::Reflection,
        false,
    );
    let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
    let gf: Vec<f32> = g.iter().map(|&v| v as f32).collect();
    let got = grid_sample(
        &Tensor::from_vec(xf, [2, 1, 3, 4]),
        &Tensor::from_vec(gf, [2, 5, 1, 2]),
        GM::Bicubic,
        GP::Reflection,
        false,
    )
    .unwrap();
    assert_close("f32 bicubic", &got.to_vec::<f64>().unwrap(), &want, 1e-5);
}

#[test]
fn grid_sample_hand_computed_values() {
    let x = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0], [1, 1, 2, 2]);
    let sample = |pts: Vec<f64>, mode, pad, align| {
        let k = pts.len() / 2;
        grid_sample(&x, &Tensor::from_vec(pts, [1, 1, k, 2]), mode, pad, align)
            .unwrap()
            .to_vec::<f64>()
            .unwrap()
    };
    // Corners with align_corners, centre, and outside (zeros: half weight on the border).
    assert_eq!(
        sample(
            vec![-1.0, -1.0, 1.0, 1.0, 0.0, 0.0],
            GM::Bilinear,
            GP::Zeros,
            true
        ),
        vec![1.0, 4.0, 2.5]
    );
    // Without align_corners -1 is the outer corner: a quarter of pixel (0, 0).
    assert_eq!(
        sample(vec![-1.0, -1.0], GM::Bilinear, GP::Zeros, false),
        vec![0.25]
    );
    assert_eq!(
        sample(vec![-1.0, -1.0], GM::Bilinear, GP::Border, false),
        vec![1.0]
    );
    // Nearest rounds half to even: x = 0.5 (between columns 0 and 1) picks column 0.
    assert_eq!(
        sample(vec![0.0, -1.0, 0.0, 1.0], GM::Nearest, GP::Zeros, true),
        vec![1.0, 3.0]
    );
    // Reflection with align_corners: x = 4 is column 2.5, which reflects (off column 1,
    // then off column 0) to column 0.5, halfway between 1 and 2.
    let r = sample(vec![4.0, -1.0], GM::Bilinear, GP::Reflection, true);
    assert!((r[0] - 1.5).abs() < 1e-12, "{r:?}");
}

#[test]
fn grid_sample_gradients_reach_input_and_grid() {
    let mut rng = Rng(4242);
    let shape = [1usize, 2, 3, 4];
    let x = values(&mut rng, 24, -1.0, 1.0);
    for mode in [GM::Bilinear, GM::Bicubic] {
        for pad in PADS {
            for align in [false, true] {
                // Inside the image (border and reflection clip nothing), off pixel lines.
                let g = values(&mut rng, 2 * 3 * 2, -0.8, 0.8);
                let gt = Tensor::from_vec(g.clone(), [1, 2, 3, 2]);
                let w = Tensor::from_vec(values(&mut rng, 12, -1.0, 1.0), [1, 2, 2, 3]);
                let name = format!("{mode:?} {pad:?} align={align}");
                gradcheck(
                    &format!("d input {name}"),
                    &x,
                    &shape,
                    &|t| (&grid_sample(t, &gt, mode, pad, align).unwrap() * &w).sum(..),
                    1e-6,
                );
                let xt = Tensor::from_vec(x.clone(), shape);
                gradcheck(
                    &format!("d grid {name}"),
                    &g,
                    &[1, 2, 3, 2],
                    &|t| (&grid_sample(&xt, t, mode, pad, align).unwrap() * &w).sum(..),
                    1e-5,
                );
            }
        }
    }
    // Reflection and border outside the image: the grid's gradient follows the
    // reflection's slope (and is zero where border clips).
    let g = vec![1.3, -1.4, -1.7, 0.2, 0.45, 1.6];
    let xt = Tensor::from_vec(x.clone(), shape);
    let w = Tensor::from_vec(values(&mut rng, 6, -1.0, 1.0), [1, 2, 1, 3]);
    for pad in [GP::Reflection, GP::Border] {
        gradcheck(
            &format!("d grid outside {pad:?}"),
            &g,
            &[1, 1, 3, 2],
            &|t| (&grid_sample(&xt, t, GM::Bilinear, pad, false).unwrap() * &w).sum(..),
            1e-5,
        );
    }
    // 5-D trilinear.
    let x3 = values(&mut rng, 2 * 2 * 3 * 2, -1.0, 1.0);
    let g3 = values(&mut rng, 4 * 3, -0.9, 0.9);
    let g3t = Tensor::from_vec(g3.clone(), [1, 2, 2, 1, 3]);
    let w3 = Tensor::from_vec(values(&mut rng, 8, -1.0, 1.0), [1, 2, 2, 2, 1]);
    gradcheck(
        "d input trilinear",
        &x3,
        &[1, 2, 2, 3, 2],
        &|t| (&grid_sample(t, &g3t, GM::Bilinear, GP::Zeros, false).unwrap() * &w3).sum(..),
        1e-6,
    );
    let x3t = Tensor::from_vec(x3, [1, 2, 2, 3, 2]);
    gradcheck(
        "d grid trilinear",
        &g3,
        &[1, 2, 2, 1, 3],
        &|t| (&grid_sample(&x3t, t, GM::Bilinear, GP::Zeros, false).unwrap() * &w3).sum(..),
        1e-5,
    );
}

#[test]
fn affine_grid_matches_its_definition() {
    let mut rng = Rng(99);
    for case in 0..8 {
        let align = case % 2 == 0;
        let three = case >= 4;
        let n = 1 + rng.below(2);
        let size: Vec<usize> = if three {
            vec![n, 1, 1 + rng.below(3), 1 + rng.below(4), 1 + rng.below(4)]
        } else {
            vec![n, 3, 1 + rng.below(5), 1 + rng.below(5)]
        };
        let d = size.len() - 2;
        let theta = values(&mut rng, n * d * (d + 1), -1.5, 1.5);
        let got = affine_grid(
            &Tensor::from_vec(theta.clone(), [n, d, d + 1]),
            &size,
            align,
        )
        .unwrap();
        let spatial = &size[2..];
        let pos = |i: usize, len: usize| {
            if len == 1 {
                0.0
            } else if align {
                -1.0 + 2.0 * i as f64 / (len - 1) as f64
            } else {
                (2.0 * i as f64 + 1.0) / len as f64 - 1.0
            }
        };
        let points: usize = spatial.iter().product();
        let mut want = vec![];
        for ni in 0..n {
            for p in 0..points {
                let mut idx = vec![0; d];
                let mut rest = p;
                for k in (0..d).rev() {
                    idx[k] = rest % spatial[k];
                    rest /= spatial[k];
                }
                // (x, y[, z], 1): the last spatial dimension first.
                let mut base: Vec<f64> = (0..d).rev().map(|k| pos(idx[k], spatial[k])).collect();
                base.push(1.0);
                for r in 0..d {
                    let row = &theta[(ni * d + r) * (d + 1)..(ni * d + r + 1) * (d + 1)];
                    want.push(row.iter().zip(&base).map(|(a, b)| a * b).sum::<f64>());
                }
            }
        }
        let mut gshape = vec![n];
        gshape.extend_from_slice(spatial);
        gshape.push(d);
        assert_eq!(got.shape(), gshape.as_slice());
        assert_close("affine_grid", &got.to_vec::<f64>().unwrap(), &want, 1e-12);
    }
    // The gradient w.r.t. theta, through a grid_sample.
    let x = Tensor::from_vec(values(&mut rng, 2 * 4 * 5, -1.0, 1.0), [1, 2, 4, 5]);
    let theta = vec![0.8, 0.1, 0.05, -0.2, 0.7, 0.1];
    gradcheck(
        "affine_grid theta",
        &theta,
        &[1, 2, 3],
        &|t| {
            let g = affine_grid(t, &[1, 2, 3, 3], false).unwrap();
            grid_sample(&x, &g, GM::Bilinear, GP::Zeros, false)
                .unwrap()
                .sum(..)
        },
        1e-5,
    );
}

#[test]
fn grid_errors() {
    let x = Tensor::ones([1, 1, 3, 3]);
    let g = Tensor::zeros([1, 2, 2, 2]);
    let e = grid_sample(
        &x,
        &Tensor::zeros([1, 2, 2, 3]),
        GM::Bilinear,
        GP::Zeros,
        false,
    );
    assert!(matches!(e, Err(KilnError::ShapeMismatch { .. })), "{e:?}");
    let e = grid_sample(
        &x,
        &Tensor::zeros([2, 2, 2, 2]),
        GM::Bilinear,
        GP::Zeros,
        false,
    );
    assert!(matches!(e, Err(KilnError::ShapeMismatch { .. })), "{e:?}");
    let e = grid_sample(
        &Tensor::ones([1, 1, 2, 2, 2]),
        &Tensor::zeros([1, 1, 1, 1, 3]),
        GM::Bicubic,
        GP::Zeros,
        false,
    );
    assert!(matches!(e, Err(KilnError::InvalidArgument { .. })), "{e:?}");
    let e = grid_sample(
        &x,
        &g.cast(kiln::DType::F64),
        GM::Bilinear,
        GP::Zeros,
        false,
    );
    assert!(matches!(e, Err(KilnError::DTypeMismatch { .. })), "{e:?}");
    let ints = Tensor::from_vec(vec![1i64; 4], [1, 1, 2, 2]);
    let e = grid_sample(&ints, &g, GM::Nearest, GP::Zeros, false);
    assert!(
        matches!(e, Err(KilnError::UnsupportedDType { .. })),
        "{e:?}"
    );
    let theta = Tensor::zeros([1, 2, 3]);
    assert!(matches!(
        affine_grid(&theta, &[2, 1, 3, 3], false),
        Err(KilnError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        affine_grid(&theta, &[1, 1, 3, 3, 3], false),
        Err(KilnError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        affine_grid(&theta, &[1, 3, 3], false),
        Err(KilnError::InvalidArgument { .. })
    ));
}
