//! Bad input gets a typed `KilnError` from every `try_` form (never a panic), whose text names
//! the op and the shapes / dtypes / axes / devices involved; the panicking forms panic with
//! exactly that text.

use kiln::{DType, Device, KilnError, Tensor};
use std::panic::{AssertUnwindSafe, catch_unwind};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Runs a `try_` form, asserting it neither panics nor succeeds; returns the error.
#[track_caller]
fn err<T>(f: impl FnOnce() -> kiln::Result<T>) -> KilnError {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(_)) => panic!("expected an error, got Ok"),
        Ok(Err(e)) => e,
        Err(p) => panic!("the try_ form panicked: {}", payload(&*p)),
    }
}

fn payload(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "<non-string panic payload>".into()
    }
}

/// Runs a panicking form and returns its panic message (a `String` payload).
#[track_caller]
fn panic_text<T>(f: impl FnOnce() -> T) -> String {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(_) => panic!("expected a panic"),
        Err(p) => p
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_else(|| panic!("panic payload is not a String: {}", payload(&*p))),
    }
}

/// The panicking form panics with exactly the error's Display text.
#[track_caller]
fn same_panic<T>(e: &KilnError, f: impl FnOnce() -> T) {
    assert_eq!(panic_text(f), e.to_string());
}

#[track_caller]
fn mentions(e: &KilnError, parts: &[&str]) {
    let s = e.to_string();
    for p in parts {
        assert!(s.contains(p), "{s:?} does not mention {p:?}");
    }
}

fn f32s(shape: &[usize]) -> Tensor {
    Tensor::zeros(shape)
}

// ---------------------------------------------------------------------------------------------
// Broadcasting and binary ops
// ---------------------------------------------------------------------------------------------

#[test]
fn add_of_non_broadcastable_shapes() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[4]));
    let e = err(|| a.try_add(&b));
    match &e {
        KilnError::ShapeMismatch {
            op: "add",
            lhs,
            rhs,
            ..
        } => {
            assert_eq!((lhs.as_slice(), rhs.as_slice()), (&[2, 3][..], &[4][..]));
        }
        other => panic!("wrong variant: {other:?}"),
    }
    mentions(&e, &["add", "[2, 3]", "[4]"]);
    assert_eq!(
        e.to_string(),
        "add: shapes [2, 3] and [4] are incompatible: dimension 1 has sizes 3 and 4 (cannot broadcast)"
    );
    same_panic(&e, || a.add(&b));
    same_panic(&e, || &a + &b);
    same_panic(&e, || a.clone() + b.clone());

    // Every binary op names itself.
    for (name, r) in [
        ("sub", a.try_sub(&b)),
        ("mul", a.try_mul(&b)),
        ("div", a.try_div(&b)),
        ("maximum", a.try_maximum(&b)),
        ("minimum", a.try_minimum(&b)),
        ("lt", a.try_lt(&b)),
        ("le", a.try_le(&b)),
        ("gt", a.try_gt(&b)),
        ("ge", a.try_ge(&b)),
        ("eq", a.try_eq(&b)),
        ("ne", a.try_ne(&b)),
        ("pow", a.try_pow(&b)),
    ] {
        let e = r.expect_err("error");
        assert!(
            matches!(&e, KilnError::ShapeMismatch { op, .. } if *op == name),
            "{name}: {e:?}"
        );
        mentions(&e, &[name, "[2, 3]", "[4]"]);
    }
    let e = err(|| b.try_mul(&a));
    same_panic(&e, || &b * &a);
    let e = err(|| a.try_sub(&b));
    same_panic(&e, || &a - &b);
    let e = err(|| a.try_div(&b));
    same_panic(&e, || &a / &b);
}

#[test]
fn mixed_dtype_and_rank_mismatch_still_reports_shapes() {
    let a = Tensor::zeros_dtype([2, 3, 5], DType::I32);
    let b = Tensor::zeros_dtype([3, 4], DType::F16);
    let e = err(|| a.try_add(&b));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "add", lhs, rhs, .. }
            if lhs == &[2, 3, 5] && rhs == &[3, 4]),
        "{e:?}"
    );
    mentions(&e, &["add", "[2, 3, 5]", "[3, 4]"]);
}

#[test]
fn sub_and_pow_of_bools() {
    let a = Tensor::from_vec(vec![true, false], [2]);
    let b = Tensor::from_vec(vec![true, true], [2]);
    let e = err(|| a.try_sub(&b));
    assert!(
        matches!(
            &e,
            KilnError::UnsupportedDType {
                op: "sub",
                dtype: DType::Bool,
                ..
            }
        ),
        "{e:?}"
    );
    mentions(&e, &["sub", "bool"]);
    same_panic(&e, || a.sub(&b));
    same_panic(&e, || &a - &b);
    let e = err(|| a.try_sub(true));
    assert!(
        matches!(&e, KilnError::UnsupportedDType { op: "sub", .. }),
        "{e:?}"
    );
    let e = err(|| a.try_pow(&b));
    assert!(
        matches!(
            &e,
            KilnError::UnsupportedDType {
                op: "pow",
                dtype: DType::Bool,
                ..
            }
        ),
        "{e:?}"
    );
    mentions(&e, &["pow", "bool"]);
    same_panic(&e, || a.pow(&b));
}

#[test]
fn neg_abs_relu_of_bool() {
    let a = Tensor::from_vec(vec![true, false], [2]);
    let e = err(|| a.try_neg());
    assert!(
        matches!(
            &e,
            KilnError::UnsupportedDType {
                op: "neg",
                dtype: DType::Bool,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.to_string(), "neg: dtype bool is not supported");
    same_panic(&e, || a.neg());
    same_panic(&e, || -&a);
    same_panic(&e, || -a.clone());
    for (name, r) in [("abs", a.try_abs()), ("relu", a.try_relu())] {
        let e = r.expect_err("error");
        assert!(
            matches!(&e, KilnError::UnsupportedDType { op, dtype: DType::Bool, .. } if *op == name),
            "{e:?}"
        );
        mentions(&e, &[name, "bool"]);
    }
}

#[test]
fn operands_on_different_devices() {
    // Recording a transfer needs no GPU; the mismatch is caught when the op is recorded.
    let a = f32s(&[2]);
    let g = a.to(Device::Cuda(0));
    let e = err(|| a.try_add(&g));
    assert!(
        matches!(
            &e,
            KilnError::DeviceMismatch {
                op: "add",
                lhs: Device::Cpu,
                rhs: Device::Cuda(0)
            }
        ),
        "{e:?}"
    );
    mentions(&e, &["add", "cpu", "cuda:0"]);
    same_panic(&e, || &a + &g);
    let e = err(|| f32s(&[2, 2]).try_matmul(&f32s(&[2, 2]).to(Device::Cuda(0))));
    assert!(
        matches!(&e, KilnError::DeviceMismatch { op: "matmul", .. }),
        "{e:?}"
    );
    mentions(&e, &["matmul", "cpu", "cuda:0"]);
    let c = Tensor::from_vec(vec![true, false], [2]);
    let e = err(|| Tensor::try_where(&c, &g, 0.0));
    assert!(
        matches!(&e, KilnError::DeviceMismatch { op: "where", .. }),
        "{e:?}"
    );
    mentions(&e, &["where", "cpu", "cuda:0"]);
}

// ---------------------------------------------------------------------------------------------
// matmul
// ---------------------------------------------------------------------------------------------

#[test]
fn matmul_inner_dimension_mismatch() {
    let (a, b) = (f32s(&[2, 3]), f32s(&[4, 5]));
    let e = err(|| a.try_matmul(&b));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "matmul", lhs, rhs, .. }
            if lhs == &[2, 3] && rhs == &[4, 5]),
        "{e:?}"
    );
    mentions(&e, &["matmul", "[2, 3]", "[4, 5]", "3", "4"]);
    same_panic(&e, || a.matmul(&b));
    // 1-D operands report their own shapes.
    let (v, w) = (f32s(&[3]), f32s(&[4]));
    let e = err(|| v.try_matmul(&w));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "matmul", lhs, rhs, .. }
            if lhs == &[3] && rhs == &[4]),
        "{e:?}"
    );
    mentions(&e, &["matmul", "[3]", "[4]"]);
    let e = err(|| v.try_matmul(&b));
    mentions(&e, &["matmul", "[3]", "[4, 5]"]);
    // Batch dimensions that cannot broadcast.
    let (x, y) = (f32s(&[2, 2, 3]), f32s(&[3, 3, 4]));
    let e = err(|| x.try_matmul(&y));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "matmul", lhs, rhs, .. }
            if lhs == &[2, 2, 3] && rhs == &[3, 3, 4]),
        "{e:?}"
    );
    mentions(&e, &["matmul", "[2, 2, 3]", "[3, 3, 4]", "batch"]);
    same_panic(&e, || x.matmul(&y));
}

#[test]
fn matmul_of_zero_dim_tensors() {
    let s = Tensor::scalar(2.0f32);
    let v = f32s(&[3]);
    let e = err(|| s.try_matmul(&v));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "matmul", lhs, rhs, .. }
            if lhs.is_empty() && rhs == &[3]),
        "{e:?}"
    );
    mentions(&e, &["matmul", "[]", "[3]"]);
    same_panic(&e, || s.matmul(&v));
    let e = err(|| v.try_matmul(&s));
    mentions(&e, &["matmul", "[3]", "[]"]);
    same_panic(&e, || v.matmul(&s));
}

#[test]
fn matmul_of_bools() {
    let a = Tensor::from_vec(vec![true; 4], [2, 2]);
    let f = f32s(&[2, 2]);
    let e = err(|| a.try_matmul(&a));
    assert!(
        matches!(
            &e,
            KilnError::UnsupportedDType {
                op: "matmul",
                dtype: DType::Bool,
                ..
            }
        ),
        "{e:?}"
    );
    mentions(&e, &["matmul", "bool"]);
    same_panic(&e, || a.matmul(&a));
    let e = err(|| f.try_matmul(&a));
    assert!(
        matches!(
            &e,
            KilnError::UnsupportedDType {
                op: "matmul",
                dtype: DType::Bool,
                ..
            }
        ),
        "{e:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Shape arguments
// ---------------------------------------------------------------------------------------------

#[test]
fn reshape_to_wrong_element_count() {
    let a = f32s(&[2, 3]);
    let e = err(|| a.try_reshape([4, 2]));
    match &e {
        KilnError::InvalidShape {
            op: "reshape",
            shape,
            requested,
            ..
        } => {
            assert_eq!(shape, &[2, 3]);
            assert_eq!(requested, &[4, 2]);
        }
        other => panic!("wrong variant: {other:?}"),
    }
    mentions(&e, &["reshape", "[2, 3]", "[4, 2]", "6"]);
    same_panic(&e, || a.reshape([4, 2]));
    // -1 that cannot be inferred, and other negative sizes.
    let e = err(|| a.try_reshape([4, -1]));
    assert!(
        matches!(&e, KilnError::InvalidShape { op: "reshape", .. }),
        "{e:?}"
    );
    mentions(&e, &["reshape", "[2, 3]", "[4, -1]"]);
    same_panic(&e, || a.reshape([4, -1]));
    let e = err(|| a.try_reshape([-2, -3]));
    assert!(
        matches!(&e, KilnError::InvalidShape { op: "reshape", .. }),
        "{e:?}"
    );
    mentions(&e, &["reshape", "[-2, -3]"]);
    let e = err(|| f32s(&[0, 4]).try_reshape([0, -1]));
    assert!(
        matches!(&e, KilnError::InvalidShape { op: "reshape", .. }),
        "{e:?}"
    );
}

#[test]
fn reshape_with_two_inferred_dims() {
    let a = f32s(&[2, 3]);
    let e = err(|| a.try_reshape([-1, -1]));
    match &e {
        KilnError::InvalidShape {
            op: "reshape",
            shape,
            requested,
            reason,
        } => {
            assert_eq!(shape, &[2, 3]);
            assert_eq!(requested, &[-1, -1]);
            assert!(reason.contains("-1"), "{reason}");
        }
        other => panic!("wrong variant: {other:?}"),
    }
    mentions(&e, &["reshape", "[2, 3]", "[-1, -1]"]);
    same_panic(&e, || a.reshape([-1, -1]));
}

#[test]
fn permute_with_repeated_missing_or_bad_axis() {
    let a = f32s(&[2, 3, 4]);
    let e = err(|| a.try_permute([0, 0, 1]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "permute", shape, .. } if shape == &[2, 3, 4]),
        "{e:?}"
    );
    mentions(&e, &["permute", "[2, 3, 4]", "[0, 0, 1]"]);
    same_panic(&e, || a.permute([0, 0, 1]));
    // -3 and 0 are the same axis.
    let e = err(|| a.try_permute([0, 1, -3]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "permute", .. }),
        "{e:?}"
    );
    // A missing axis (too few entries) and too many entries.
    let e = err(|| a.try_permute([1, 0]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "permute", shape, .. } if shape == &[2, 3, 4]),
        "{e:?}"
    );
    mentions(&e, &["permute", "[2, 3, 4]", "[1, 0]"]);
    same_panic(&e, || a.permute([1, 0]));
    let e = err(|| a.try_permute([0, 1, 2, 3]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "permute", .. }),
        "{e:?}"
    );
    // An axis out of range.
    let e = err(|| a.try_permute([0, 1, 3]));
    assert!(
        matches!(&e, KilnError::InvalidAxis { op: "permute", axis: 3, shape } if shape == &[2, 3, 4]),
        "{e:?}"
    );
    mentions(&e, &["permute", "3", "[2, 3, 4]"]);
    same_panic(&e, || a.permute([0, 1, 3]));
}

#[test]
fn axis_out_of_range() {
    let a = f32s(&[2, 3]);
    for axis in [2isize, -3, 7, -100] {
        let e = err(|| a.try_transpose(0, axis));
        assert_eq!(
            e,
            KilnError::InvalidAxis {
                op: "transpose",
                axis,
                shape: vec![2, 3]
            }
        );
        assert_eq!(
            e.to_string(),
            format!("transpose: axis {axis} is out of range for a tensor of shape [2, 3]")
        );
        same_panic(&e, || a.transpose(0, axis));
        let e = err(|| a.try_transpose(axis, 1));
        assert!(
            matches!(
                &e,
                KilnError::InvalidAxis {
                    op: "transpose",
                    ..
                }
            ),
            "{e:?}"
        );

        let e = err(|| a.try_sum(axis));
        assert_eq!(
            e,
            KilnError::InvalidAxis {
                op: "sum",
                axis,
                shape: vec![2, 3]
            }
        );
        mentions(&e, &["sum", &axis.to_string(), "[2, 3]"]);
        same_panic(&e, || a.sum(axis));

        let e = err(|| a.try_softmax(axis));
        assert_eq!(
            e,
            KilnError::InvalidAxis {
                op: "softmax",
                axis,
                shape: vec![2, 3]
            }
        );
        mentions(&e, &["softmax", &axis.to_string(), "[2, 3]"]);
        same_panic(&e, || a.softmax(axis));

        for (name, r) in [
            ("log_softmax", a.try_log_softmax(axis)),
            ("prod", a.try_prod_keepdim(axis)),
            ("max", a.try_max([0, axis])),
            ("min", a.try_min(axis)),
            ("argmax", a.try_argmax(axis)),
            ("argmin", a.try_argmin_keepdim(axis)),
            ("mean", a.try_mean(axis)),
            ("var", a.try_var(axis, 1)),
            ("flip", a.try_flip([axis])),
            ("slice_dim", a.try_slice_dim(axis, 0, 1, 1)),
            ("narrow", a.try_narrow(axis, 0, 1)),
            ("squeeze", a.try_squeeze_dim(axis)),
            ("flatten", a.try_flatten_dims(0, axis)),
        ] {
            let e = r
                .err()
                .unwrap_or_else(|| panic!("{name}({axis}) succeeded"));
            assert!(
                matches!(&e, KilnError::InvalidAxis { op, axis: x, shape }
                    if *op == name && *x == axis && shape == &[2, 3]),
                "{name}({axis}): {e:?}"
            );
            mentions(&e, &[name, &axis.to_string(), "[2, 3]"]);
        }
    }
    // unsqueeze accepts ndim+1 positions.
    for axis in [3isize, -4] {
        let e = err(|| a.try_unsqueeze(axis));
        assert_eq!(
            e,
            KilnError::InvalidAxis {
                op: "unsqueeze",
                axis,
                shape: vec![2, 3]
            }
        );
        same_panic(&e, || a.unsqueeze(axis));
    }
    // A 0-d tensor accepts dimension 0 or -1 (as PyTorch does; see tests/hardening.rs),
    // and nothing else.
    let s = Tensor::scalar(1.0f32);
    for axis in [1isize, -2, 5] {
        let e = err(|| s.try_softmax(axis));
        assert!(
            matches!(&e, KilnError::InvalidAxis { op: "softmax", axis: x, .. } if *x == axis),
            "{e:?}"
        );
        let e = err(|| s.try_sum(axis));
        assert!(
            matches!(&e, KilnError::InvalidAxis { op: "sum", axis: x, .. } if *x == axis),
            "{e:?}"
        );
        mentions(&e, &["sum", &axis.to_string()]);
    }
}

#[test]
fn duplicate_reduce_axes() {
    let a = f32s(&[2, 3]);
    let e = err(|| a.try_sum([0, -2]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "sum", shape, .. } if shape == &[2, 3]),
        "{e:?}"
    );
    mentions(&e, &["sum", "[2, 3]", "twice"]);
    same_panic(&e, || a.sum([0, -2]));
    let e = err(|| a.try_max_keepdim([1, 1]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "max", .. }),
        "{e:?}"
    );
    same_panic(&e, || a.max_keepdim([1, 1]));
    let e = err(|| a.try_mean([1, -1]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "mean", .. }),
        "{e:?}"
    );
    same_panic(&e, || a.mean([1, -1]));
    let e = err(|| a.try_var([0, 0], 0));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "var", .. }),
        "{e:?}"
    );
    let e = err(|| a.try_flip([1, -1]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "flip", .. }),
        "{e:?}"
    );
    same_panic(&e, || a.flip([1, -1]));
}

#[test]
fn slice_with_bad_step_or_too_many_ranges() {
    let a = f32s(&[4, 5]);
    let e = err(|| a.try_slice(&[(0, 4, 1), (0, 5, 0)]));
    match &e {
        KilnError::InvalidArgument {
            op: "slice",
            shape,
            reason,
        } => {
            assert_eq!(shape, &[4, 5]);
            assert!(
                reason.contains("step 0") && reason.contains("dimension 1"),
                "{reason}"
            );
        }
        other => panic!("wrong variant: {other:?}"),
    }
    mentions(&e, &["slice", "[4, 5]", "step 0"]);
    same_panic(&e, || a.slice(&[(0, 4, 1), (0, 5, 0)]));
    let e = err(|| a.try_slice(&[(3, 0, -1)]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "slice", .. }),
        "{e:?}"
    );
    mentions(&e, &["slice", "-1"]);
    let e = err(|| a.try_slice_dim(1, 0, 5, 0));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "slice", .. }),
        "{e:?}"
    );
    same_panic(&e, || a.slice_dim(1, 0, 5, 0));
    let e = err(|| a.try_slice(&[(0, 1, 1), (0, 1, 1), (0, 1, 1)]));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "slice", shape, .. } if shape == &[4, 5]),
        "{e:?}"
    );
    mentions(&e, &["slice", "[4, 5]", "3"]);
}

#[test]
fn pad_with_too_many_pairs() {
    let a = f32s(&[2, 3]);
    let e = err(|| a.try_pad(&[(1, 1), (0, 0), (2, 2)], 0.0));
    match &e {
        KilnError::InvalidArgument {
            op: "pad",
            shape,
            reason,
        } => {
            assert_eq!(shape, &[2, 3]);
            assert!(reason.contains('3') && reason.contains('2'), "{reason}");
        }
        other => panic!("wrong variant: {other:?}"),
    }
    mentions(&e, &["pad", "[2, 3]"]);
    same_panic(&e, || a.pad(&[(1, 1), (0, 0), (2, 2)], 0.0));
}

#[test]
fn broadcast_to_an_incompatible_shape() {
    let a = f32s(&[2, 3]);
    let e = err(|| a.try_broadcast_to([3, 3]));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "broadcast_to", lhs, rhs, .. }
            if lhs == &[2, 3] && rhs == &[3, 3]),
        "{e:?}"
    );
    mentions(&e, &["broadcast_to", "[2, 3]", "[3, 3]"]);
    same_panic(&e, || a.broadcast_to([3, 3]));
    same_panic(&e, || a.expand([3, 3]));
    // Fewer dimensions than the input.
    let e = err(|| a.try_broadcast_to([3]));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "broadcast_to", lhs, rhs, .. }
            if lhs == &[2, 3] && rhs == &[3]),
        "{e:?}"
    );
    // A size that would have to shrink.
    let e = err(|| f32s(&[2, 1]).try_broadcast_to([1, 4]));
    mentions(&e, &["broadcast_to", "[2, 1]", "[1, 4]"]);
}

#[test]
fn flatten_dims_in_wrong_order() {
    let a = f32s(&[2, 3, 4]);
    let e = err(|| a.try_flatten_dims(2, 0));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "flatten", shape, .. } if shape == &[2, 3, 4]),
        "{e:?}"
    );
    mentions(&e, &["flatten", "[2, 3, 4]"]);
    same_panic(&e, || a.flatten_dims(2, 0));
}

// ---------------------------------------------------------------------------------------------
// Constructors
// ---------------------------------------------------------------------------------------------

#[test]
fn from_vec_with_wrong_length() {
    let e = err(|| Tensor::try_from_vec(vec![1.0f32; 5], [2, 3]));
    assert_eq!(
        e,
        KilnError::DataLength {
            op: "from_vec",
            len: 5,
            shape: vec![2, 3],
            numel: 6
        }
    );
    assert_eq!(
        e.to_string(),
        "from_vec: 5 values cannot fill shape [2, 3] (6 elements)"
    );
    same_panic(&e, || Tensor::from_vec(vec![1.0f32; 5], [2, 3]));
    let e = err(|| Tensor::try_from_slice(&[1i64, 2, 3], [2]));
    assert!(
        matches!(
            &e,
            KilnError::DataLength {
                len: 3,
                numel: 2,
                ..
            }
        ),
        "{e:?}"
    );
    same_panic(&e, || Tensor::from_slice(&[1i64, 2, 3], [2]));
    // Empty data for a non-empty shape, and data for a zero-size shape.
    let e = err(|| Tensor::try_from_vec(Vec::<u8>::new(), [1]));
    mentions(&e, &["from_vec", "0", "[1]"]);
    let e = err(|| Tensor::try_from_vec(vec![true], [0, 4]));
    mentions(&e, &["from_vec", "1", "[0, 4]"]);
    // Raw bytes: wrong length, and bool bytes that are not 0/1.
    let e = err(|| Tensor::try_from_bytes(&[0u8; 7], &[2], DType::F32));
    assert!(
        matches!(
            &e,
            KilnError::DataLength {
                op: "from_bytes",
                ..
            }
        ),
        "{e:?}"
    );
    let e = err(|| Tensor::try_from_bytes(&[0u8, 2], &[2], DType::Bool));
    assert!(
        matches!(
            &e,
            KilnError::InvalidArgument {
                op: "from_bytes",
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn arange_with_zero_step_or_wrong_direction() {
    let e = err(|| Tensor::try_arange(0, 5, 0, DType::I32));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "arange", .. }),
        "{e:?}"
    );
    mentions(&e, &["arange", "0", "5"]);
    let e = err(|| Tensor::try_arange(0, 5, -1, DType::I64));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "arange", .. }),
        "{e:?}"
    );
    mentions(&e, &["arange", "0", "5", "-1"]);
    // The panicking f32 form.
    let e = err(|| Tensor::try_arange(0.0f32, 5.0f32, 0.0f32, DType::F32));
    mentions(&e, &["arange", "0.0", "5.0"]);
    same_panic(&e, || Tensor::arange(0.0, 5.0, 0.0));
    let e = err(|| Tensor::try_arange(0.0f32, 5.0f32, -1.0f32, DType::F32));
    mentions(&e, &["arange", "-1.0"]);
    same_panic(&e, || Tensor::arange(0.0, 5.0, -1.0));
    let e = err(|| Tensor::try_arange(5.0, 0.0, 0.5, DType::F32));
    assert!(
        matches!(&e, KilnError::InvalidArgument { op: "arange", .. }),
        "{e:?}"
    );
    for (s, t, st) in [
        (0.0, 1.0, f64::NAN),
        (0.0, f64::INFINITY, 1.0),
        (f64::NAN, 1.0, 1.0),
        (0.0, 1.0, f64::INFINITY),
    ] {
        let e = err(|| Tensor::try_arange(s, t, st, DType::F64));
        assert!(
            matches!(&e, KilnError::InvalidArgument { op: "arange", .. }),
            "{e:?}"
        );
    }
}

#[test]
fn random_with_a_non_float_dtype() {
    for dt in [DType::I32, DType::I64, DType::U8, DType::Bool] {
        let e = err(|| Tensor::try_rand([2, 2], 0, dt));
        assert!(
            matches!(&e, KilnError::UnsupportedDType { op: "rand", dtype, .. } if *dtype == dt),
            "{e:?}"
        );
        mentions(&e, &["rand", dt.name()]);
        let e = err(|| Tensor::try_randn([2], 0, dt));
        assert!(
            matches!(&e, KilnError::UnsupportedDType { op: "randn", dtype, .. } if *dtype == dt),
            "{e:?}"
        );
        mentions(&e, &["randn", dt.name()]);
    }
}

// ---------------------------------------------------------------------------------------------
// Reductions and composites
// ---------------------------------------------------------------------------------------------

#[test]
fn mean_and_var_of_int_tensors() {
    for dt in [DType::I32, DType::I64, DType::U8, DType::Bool] {
        let a = Tensor::zeros_dtype([2, 3], dt);
        let e = err(|| a.try_mean(1));
        assert_eq!(
            e,
            KilnError::UnsupportedDType {
                op: "mean",
                dtype: dt,
                detail: ": needs a float dtype (cast first)".into()
            }
        );
        mentions(&e, &["mean", dt.name()]);
        same_panic(&e, || a.mean(1));
        let e = err(|| a.try_var(.., 1));
        assert!(
            matches!(&e, KilnError::UnsupportedDType { op: "var", dtype, .. } if *dtype == dt),
            "{e:?}"
        );
        same_panic(&e, || a.var(.., 1));
    }
}

#[test]
fn max_over_an_empty_axis() {
    let a = f32s(&[0, 3]);
    let e = err(|| a.try_max(0));
    match &e {
        KilnError::InvalidArgument {
            op: "max", shape, ..
        } => assert_eq!(shape, &[0, 3]),
        other => panic!("wrong variant: {other:?}"),
    }
    // The message names the empty dimension and says why, and does not read as a reshape.
    mentions(
        &e,
        &["max", "[0, 3]", "dimension 0 has size 0", "no identity"],
    );
    assert!(!e.to_string().contains("cannot turn shape"), "{e}");
    same_panic(&e, || a.max(0));
    for (name, r) in [
        ("min", a.try_min(..)),
        ("argmax", a.try_argmax(0)),
        ("argmin", a.try_argmin(..)),
        ("max", a.try_max_keepdim([-2, 1])),
    ] {
        let e = r.err().unwrap_or_else(|| panic!("{name} succeeded"));
        assert!(
            matches!(&e, KilnError::InvalidArgument { op, .. } if *op == name),
            "{name}: {e:?}"
        );
        mentions(&e, &[name, "size 0"]);
    }
}

#[test]
fn softmax_over_an_empty_axis() {
    let a = f32s(&[0, 3]);
    let r = catch_unwind(AssertUnwindSafe(|| a.try_softmax(0))).expect("no panic");
    assert_eq!(r.expect("softmax over an empty axis").shape(), &[0, 3]);
    let r = catch_unwind(AssertUnwindSafe(|| a.try_log_softmax(0))).expect("no panic");
    assert_eq!(r.expect("log_softmax over an empty axis").shape(), &[0, 3]);
}

#[test]
fn layer_norm_with_wrong_shapes() {
    let x = f32s(&[2, 3]);
    let e = err(|| x.try_layer_norm(&[2], None, None, 1e-5));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "layer_norm", lhs, rhs, .. }
            if lhs == &[2, 3] && rhs == &[2]),
        "{e:?}"
    );
    mentions(&e, &["layer_norm", "[2, 3]", "[2]"]);
    same_panic(&e, || x.layer_norm(&[2], None, None, 1e-5));
    for bad in [&[][..], &[3, 2][..], &[1, 2, 3][..], &[2, 3, 1][..]] {
        let e = err(|| x.try_layer_norm(bad, None, None, 1e-5));
        assert!(
            matches!(
                &e,
                KilnError::ShapeMismatch {
                    op: "layer_norm",
                    ..
                }
            ),
            "{bad:?}: {e:?}"
        );
    }
    let w = f32s(&[2]);
    let e = err(|| x.try_layer_norm(&[3], Some(&w), None, 1e-5));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "layer_norm", lhs, rhs, .. }
            if lhs == &[2] && rhs == &[3]),
        "{e:?}"
    );
    mentions(&e, &["layer_norm", "[2]", "[3]", "weight"]);
    same_panic(&e, || x.layer_norm(&[3], Some(&w), None, 1e-5));
    let b = f32s(&[1, 3]);
    let e = err(|| x.try_layer_norm(&[3], None, Some(&b), 1e-5));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "layer_norm", lhs, rhs, .. }
            if lhs == &[1, 3] && rhs == &[3]),
        "{e:?}"
    );
    mentions(&e, &["layer_norm", "[1, 3]", "[3]", "bias"]);
}

// ---------------------------------------------------------------------------------------------
// Read-back and where
// ---------------------------------------------------------------------------------------------

#[test]
fn to_vec_converts_to_the_requested_element_type() {
    // As `cast` converts: floats truncate toward zero into integers, NaN becomes 0, bools
    // read as 0/1, and every value converts exactly where the target can hold it.
    let a = Tensor::from_vec(vec![1.5f32, -2.7, f32::NAN, 3e9], [4]);
    assert_eq!(a.to_vec::<f64>().unwrap()[..2], [1.5, -2.700000047683716]);
    assert_eq!(a.to_vec::<i32>().unwrap(), vec![1, -2, 0, i32::MAX]);
    assert_eq!(a.to_vec::<i64>().unwrap(), vec![1, -2, 0, 3_000_000_000]);
    let h = Tensor::from_vec(vec![1.0f32, 0.1], [2]).cast(DType::F16);
    assert_eq!(
        h.to_vec::<half::bf16>().unwrap(),
        vec![
            half::bf16::from_f32(1.0),
            half::bf16::from_f32(half::f16::from_f32(0.1).to_f32())
        ]
    );
    let b = Tensor::from_vec(vec![true, false], [2]);
    assert_eq!(b.to_vec::<u8>().unwrap(), vec![1, 0]);
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
    assert_eq!(Tensor::scalar(true).item::<u8>().unwrap(), 1);
    let i = Tensor::from_vec(vec![0i64, 5, -3], [3]);
    assert_eq!(i.to_vec::<bool>().unwrap(), vec![false, true, true]);
    // Reading converts without changing the tensor.
    assert_eq!(a.dtype(), DType::F32);
}

#[test]
fn item_on_a_multi_element_tensor() {
    let a = f32s(&[2, 2]);
    let e = err(|| a.item::<f32>());
    match &e {
        KilnError::InvalidShape {
            op: "item", shape, ..
        } => assert_eq!(shape, &[2, 2]),
        other => panic!("wrong variant: {other:?}"),
    }
    mentions(&e, &["item", "[2, 2]"]);
    let e = err(|| f32s(&[0]).item::<f32>());
    assert!(
        matches!(&e, KilnError::InvalidShape { op: "item", .. }),
        "{e:?}"
    );
    mentions(&e, &["item", "[0]"]);
}

#[test]
fn where_with_incompatible_shapes() {
    let c = Tensor::from_vec(vec![true, false], [2]);
    let a = f32s(&[3]);
    let e = err(|| Tensor::try_where(&c, &a, 0.0));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "where", lhs, rhs, .. }
            if lhs == &[2] && rhs == &[3]),
        "{e:?}"
    );
    mentions(&e, &["where", "[2]", "[3]"]);
    same_panic(&e, || Tensor::where_(&c, &a, 0.0));
    // The two branches disagree.
    let c = Tensor::from_vec(vec![true; 6], [2, 3]);
    let b = f32s(&[4]);
    let e = err(|| Tensor::try_where(&c, &a, &b));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "where", lhs, rhs, .. }
            if lhs == &[3] && rhs == &[4]),
        "{e:?}"
    );
    mentions(&e, &["where", "[3]", "[4]"]);
    same_panic(&e, || Tensor::where_(&c, &a, &b));
    // A condition of the wrong shape.
    let ci = Tensor::zeros_dtype([5], DType::Bool);
    let e = err(|| Tensor::try_where(&ci, &a, 0));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "where", .. }),
        "{e:?}"
    );
    mentions(&e, &["where", "[5]", "[3]"]);
}

#[test]
fn masked_fill_with_an_incompatible_mask() {
    let x = f32s(&[2, 3]);
    let m = Tensor::from_vec(vec![true, false], [2]);
    let e = err(|| x.try_masked_fill(&m, 1.0));
    assert!(
        matches!(&e, KilnError::ShapeMismatch { op: "masked_fill", lhs, rhs, .. }
            if lhs == &[2, 3] && rhs == &[2]),
        "{e:?}"
    );
    mentions(&e, &["masked_fill", "[2, 3]", "[2]"]);
    same_panic(&e, || x.masked_fill(&m, 1.0));
    // A mask of the wrong dtype.
    let e = err(|| x.try_masked_fill(&f32s(&[3]), 1.0));
    assert!(
        matches!(
            &e,
            KilnError::UnsupportedDType {
                op: "masked_fill",
                ..
            }
        ),
        "{e:?}"
    );
    // As PyTorch's out-of-place form, a mask with more dimensions (or size-1 dimensions of
    // the tensor against a longer mask) broadcasts the result.
    let x = Tensor::from_vec(vec![0.0f32, 1.0], [2, 1]);
    let m = Tensor::from_vec(vec![true, false, true], [1, 1, 3]);
    let y = x.masked_fill(&m, 7.0);
    assert_eq!(y.shape(), &[1, 2, 3]);
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        vec![7.0, 0.0, 7.0, 7.0, 1.0, 7.0]
    );
}

// ---------------------------------------------------------------------------------------------
// After errors
// ---------------------------------------------------------------------------------------------

#[test]
fn errors_leave_the_runtime_usable() {
    let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    let _ = err(|| a.try_reshape([2, 2]));
    let _ = err(|| a.try_matmul(&f32s(&[2])));
    let _ = panic_text(|| a.add(f32s(&[2])));
    let _ = panic_text(|| a.sum(3));
    let y = (&a * 2.0).sum(0);
    assert_eq!(y.item::<f32>().unwrap(), 12.0);
    // Errors are values: Clone, PartialEq, Debug.
    let e1 = err(|| a.try_softmax(5));
    let e2 = e1.clone();
    assert_eq!(e1, e2);
    assert!(format!("{e1:?}").contains("InvalidAxis"));
    let boxed: Box<dyn std::error::Error> = Box::new(e1);
    assert!(boxed.to_string().contains("softmax"));
}
