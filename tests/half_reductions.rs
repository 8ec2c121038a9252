//! Row reductions of stored f16 and bf16 tensors, which the CPU backend folds straight from
//! the 16-bit values (widening each inside the reduction loop). The lanes and order are
//! those of reducing the widened f32 values, so every result must equal, bit for bit, the
//! same reduction of the tensor first converted to f32 and then rounded to the half type,
//! and agree with the reference evaluator; NaN and infinities propagate as in f32.

use half::{bf16, f16};
use kiln::reference;
use kiln::{DType, Tensor};

/// A realized `[rows, cols]` tensor of `dt` with values of both signs, a NaN in row 1 and
/// an infinity in row 2.
fn halves(rows: usize, cols: usize, dt: DType) -> Tensor {
    let v: Vec<f32> = (0..rows * cols)
        .map(|k| match k {
            k if k == cols + 7 => f32::NAN,
            k if k == 2 * cols + 3 => f32::INFINITY,
            k => ((k * 37 % 101) as f32 - 50.0) * 0.0625,
        })
        .collect();
    let t = match dt {
        DType::F16 => Tensor::from_vec(v.iter().map(|&x| f16::from_f32(x)).collect(), [rows, cols]),
        _ => Tensor::from_vec(v.iter().map(|&x| bf16::from_f32(x)).collect(), [rows, cols]),
    };
    t.realize().unwrap();
    t
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn half_row_reductions_equal_the_widened_reduction_rounded_once() {
    for dt in [DType::F16, DType::BF16] {
        // Rows longer than one run (1,024) and not a multiple of the lane count.
        for cols in [3000, 1500, 777] {
            let h = halves(6, cols, dt);
            let wide = h.cast(DType::F32);
            wide.realize().unwrap();
            let pairs = [
                (h.sum(-1), wide.sum(-1)),
                (h.amax(-1), wide.amax(-1)),
                (h.amin(-1), wide.amin(-1)),
                (h.prod(-1), wide.prod(-1)),
            ];
            for (i, (got, want)) in pairs.iter().enumerate() {
                assert_eq!(got.dtype(), dt);
                let g = bits(&got.cast(DType::F32));
                let w = bits(&want.cast(dt).cast(DType::F32));
                assert_eq!(g, w, "{dt:?} cols {cols} reduction {i}");
                let r = reference::evaluate(got).unwrap().to_f64();
                for (a, b) in got.to_vec::<f32>().unwrap().iter().zip(&r) {
                    let (a, b) = (*a as f64, *b);
                    assert!(
                        (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-2 * b.abs(),
                        "{dt:?} cols {cols} reduction {i}: {a} vs reference {b}"
                    );
                }
            }
            let s = h.sum(-1).cast(DType::F32).to_vec::<f32>().unwrap();
            assert!(s[1].is_nan() && s[2] == f32::INFINITY && s[0].is_finite());
        }
    }
}

#[test]
fn half_reductions_fused_with_elementwise_work_still_match() {
    // The load is read by more than the reduction here, so it is widened into a register.
    let h = halves(4, 2048, DType::F16);
    let y = (&h * 2.0 + &h).sum(-1);
    let r = reference::evaluate(&y).unwrap().to_f64();
    for (a, b) in y.to_vec::<f32>().unwrap().iter().zip(&r) {
        let (a, b) = (*a as f64, *b);
        assert!((a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-2 * (1.0 + b.abs()));
    }
}
