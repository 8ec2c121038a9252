//! Copies between layouts that keep short rows contiguous (attention's head split and merge,
//! `[b, t, h, d] <-> [b, h, t, d]`), which the CPU backend runs as one block copy per row:
//! every element checked against an index computed here and against the reference
//! evaluator, for every element size, through slices (non-zero offsets) and for sizes that
//! split into several tasks.

use kiln::reference;
use kiln::{DType, Tensor};

/// `[b, t, h, d]` holding its own flat index.
fn iota(shape: [usize; 4]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n as i64).collect::<Vec<_>>(), shape)
}

#[track_caller]
fn check_permuted(x: &Tensor, dt: DType) {
    let s = x.shape().to_vec();
    // Realized first, so the copy kernel is a plain load and store of `dt`.
    let xc = x.cast(dt);
    xc.realize().unwrap();
    let y = xc.permute([0, 2, 1, 3]).contiguous();
    let got = y.to_vec::<i64>().unwrap();
    let src = x.to_vec::<i64>().unwrap();
    let (b, t, h, d) = (s[0], s[1], s[2], s[3]);
    let wrap = |v: i64| -> i64 {
        match dt {
            DType::U8 => v as u8 as i64,
            DType::Bool => (v != 0) as i64,
            DType::F16 => half::f16::from_f64(v as f64).to_f64() as i64,
            _ => v,
        }
    };
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                for di in 0..d {
                    let out = ((bi * h + hi) * t + ti) * d + di;
                    let inp = ((bi * t + ti) * h + hi) * d + di;
                    assert_eq!(got[out], wrap(src[inp]), "{dt:?} at {out}");
                }
            }
        }
    }
    let want = reference::evaluate(&y).unwrap().to_f64();
    assert_eq!(got.iter().map(|&v| v as f64).collect::<Vec<_>>(), want);
}

#[test]
fn head_split_and_merge_copy_every_row() {
    for dt in [
        DType::I64,
        DType::F32,
        DType::I32,
        DType::F16,
        DType::U8,
        DType::Bool,
    ] {
        check_permuted(&iota([4, 16, 4, 32]), dt);
    }
    // Large enough for several tasks; and the merge back restores the input.
    let x = iota([8, 64, 4, 32]);
    check_permuted(&x, DType::I64);
    let back = x
        .permute([0, 2, 1, 3])
        .contiguous()
        .permute([0, 2, 1, 3])
        .contiguous();
    assert_eq!(back.to_vec::<i64>().unwrap(), x.to_vec::<i64>().unwrap());
}

#[test]
fn head_split_of_a_slice_reads_from_its_offset() {
    let big = iota([4, 20, 4, 32]);
    let x = big.narrow(1, 3, 16);
    let y = x.permute([0, 2, 1, 3]).contiguous();
    let got = y.to_vec::<i64>().unwrap();
    let want = reference::evaluate(&y).unwrap().to_f64();
    assert_eq!(got.iter().map(|&v| v as f64).collect::<Vec<_>>(), want);
    // Element (b=1, h=2, t=0, d=5) is input (1, 3, 2, 5).
    let at = ((4 + 2) * 16) * 32 + 5;
    assert_eq!(got[at], (((20 + 3) * 4 + 2) * 32 + 5) as i64);
}

// ---------------------------------------------------------------------------
// Products written straight into a permuted layout
// ---------------------------------------------------------------------------

use kiln::RealizeOptions;

/// Small integers as `dt` (exact in every dtype, so every product is exact too).
fn ints(shape: &[usize], seed: usize, dt: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<i64> = (0..n)
        .map(|i| ((i * 7 + seed * 13) % 9) as i64 - 4)
        .collect();
    let t = Tensor::from_vec(v, shape.to_vec()).cast(dt);
    t.realize().unwrap();
    t
}

/// Realizes `build()` fused and unfused; returns the fused kernel count after checking
/// that both give the same bits and the reference evaluator's values.
#[track_caller]
fn same_as_unfused(build: &dyn Fn() -> Tensor) -> usize {
    agrees_with_unfused(build, true)
}

/// As [`same_as_unfused`]; with `exact` false the two need only agree as closely as each
/// agrees with the reference (a large row-major product may take a route with another
/// summation order on a machine with more threads than the batch has products).
#[track_caller]
fn agrees_with_unfused(build: &dyn Fn() -> Tensor, exact: bool) -> usize {
    let f = build();
    let kernels = f.realize_with(&RealizeOptions::default()).unwrap().kernels;
    let u = build();
    u.realize_with(&RealizeOptions::unfused()).unwrap();
    let (fv, uv) = (f.to_vec::<f64>().unwrap(), u.to_vec::<f64>().unwrap());
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    if exact {
        assert_eq!(bits(&fv), bits(&uv), "fused vs unfused ({:?})", f.dtype());
    }
    let want = reference::evaluate(&f).unwrap().to_f64();
    assert_eq!(fv.len(), want.len());
    for got in [&fv, &uv] {
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-4 * w.abs().max(1.0);
            assert!((g - w).abs() <= tol, "{:?} at {i}: {g} vs {w}", f.dtype());
        }
    }
    kernels
}

#[test]
fn a_product_read_permuted_is_written_in_the_permuted_layout() {
    for dt in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
    ] {
        // Attention's head merge: [b, h, t, d] products read as [b, t, h, d].
        let a = ints(&[2, 3, 5, 4], 1, dt);
        let b = ints(&[2, 3, 4, 6], 2, dt);
        let k = same_as_unfused(&|| a.matmul(&b).permute([0, 2, 1, 3]).contiguous());
        assert_eq!(k, 1, "{dt:?}: the copy is the product itself");
        // Batch axes swapped, and a batch axis moved between the rows and columns.
        for perm in [[1, 0, 2, 3], [1, 2, 0, 3], [2, 0, 1, 3]] {
            let k = same_as_unfused(&|| a.matmul(&b).permute(perm).contiguous());
            assert_eq!(k, 1, "{dt:?} {perm:?}");
        }
        // Transposed operands read in place, with the product permuted.
        let at = ints(&[2, 3, 4, 5], 3, dt);
        let k = same_as_unfused(&|| {
            at.transpose(-1, -2)
                .matmul(&b)
                .permute([0, 2, 1, 3])
                .contiguous()
        });
        assert_eq!(k, 1, "{dt:?} transposed operand");
    }
}

#[test]
fn a_permuted_product_keeps_its_epilogue_and_feeds_the_next_product() {
    let x = Tensor::randn_seeded([4, 4, 16, 8], 1);
    let v = Tensor::randn_seeded([4, 4, 8, 8], 2);
    let w = Tensor::randn_seeded([32, 12], 3);
    for t in [&x, &v, &w] {
        t.realize().unwrap();
    }
    // An elementwise epilogue over the permuted product: still one kernel.
    let k = same_as_unfused(&|| (x.matmul(&v).transpose(1, 2) * 2.0 + 1.0).contiguous());
    assert_eq!(k, 1);
    // Heads merged and projected: the merge costs no kernel of its own.
    let k = same_as_unfused(&|| x.matmul(&v).transpose(1, 2).reshape([4, 16, 32]).matmul(&w));
    assert_eq!(k, 2);
}

#[test]
fn products_whose_columns_would_move_keep_their_copy() {
    let a = ints(&[2, 3, 5, 4], 1, DType::F32);
    let b = ints(&[2, 3, 4, 6], 2, DType::F32);
    // The product's columns become a middle axis: the product is stored row-major and
    // copied (a second kernel), and the values are the same.
    let k = same_as_unfused(&|| a.matmul(&b).permute([0, 3, 1, 2]).contiguous());
    assert_eq!(k, 2);
    let k = same_as_unfused(&|| a.matmul(&b).transpose(-1, -2).contiguous());
    assert_eq!(k, 2);
}

#[test]
fn permuted_products_of_every_size_class() {
    // Single rows and columns, zero depth, products large enough for the multithreaded
    // paths (rows of the permuted output far apart), and a long depth over a small
    // output (the shape the CPU backend's weight-gradient kernel takes when row-major).
    let cases: [([usize; 3], [usize; 3]); 6] = [
        ([3, 1, 7], [3, 7, 5]),
        ([3, 4, 7], [3, 7, 1]),
        ([3, 4, 0], [3, 0, 5]),
        ([2, 256, 128], [2, 128, 256]),
        ([2, 64, 1024], [2, 1024, 128]),
        ([4, 33, 65], [4, 65, 17]),
    ];
    for (sa, sb) in cases {
        let a = Tensor::randn_seeded(sa, 7);
        let b = Tensor::randn_seeded(sb, 8);
        a.realize().unwrap();
        b.realize().unwrap();
        let small = sa[1] * sb[2] * sa[2] < 1 << 20;
        let k = agrees_with_unfused(&|| a.matmul(&b).permute([1, 0, 2]).contiguous(), small);
        assert_eq!(k, 1, "{sa:?} @ {sb:?}");
    }
}
