//! A hostile-input sweep over the op families added most recently (CTC loss, fractional
//! max pooling, `linalg`, histograms, embedding bags, scatter/index reductions, quantiles,
//! sorts and scans, einsum, grid sampling, interpolation, learning-rate schedules).
//!
//! Each family runs a table of hostile inputs — wrong ranks and dtypes, empty tensors and
//! zero-size dimensions, 0-d tensors, size-1 dimensions, NaN and infinities, half and f64
//! inputs, non-contiguous views (permuted, stepped, expanded, flipped), absurd sizes and
//! arguments — each on a watchdog thread under `catch_unwind`. What must hold:
//!
//! * nothing panics or hangs;
//! * a refusal is a `KilnError` whose text names the op;
//! * an accepted result realizes (`to_vec`), with the shape and dtype PyTorch gives and, where
//!   PyTorch documents the value or it is computable by hand, that value;
//! * a view gives what the same call on its `.contiguous()` copy gives.
//!
//! A sweep collects every failing case and reports them all at once. The rows marked
//! "used to" are regressions: inputs that crashed kiln or returned a wrong value.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;
use std::time::Duration;

use kiln::linalg::{self, LstsqDriver, NormOrd, QrMode};
use kiln::{DType, KilnError, Tensor};

/// One family's sweep: its failures, reported together by [`Sweep::finish`].
struct Sweep {
    family: &'static str,
    failures: Vec<String>,
    cases: usize,
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

impl Sweep {
    fn new(family: &'static str) -> Sweep {
        Sweep {
            family,
            failures: Vec::new(),
            cases: 0,
        }
    }

    fn fail(&mut self, case: &str, what: impl std::fmt::Display) {
        self.failures.push(format!("{case}: {what}"));
    }

    /// Runs `f` on its own thread under `catch_unwind`; a panic or a run past 30 s is a
    /// failure (a hung thread is left behind).
    fn run<T: Send + 'static>(
        &mut self,
        case: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        self.cases += 1;
        if std::env::var_os("KILN_HOSTILE_TRACE").is_some() {
            eprintln!("case {case}");
        }
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(f));
            let _ = tx.send(r);
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(v)) => Some(v),
            Ok(Err(p)) => {
                self.fail(case, format!("panicked: {}", panic_text(p)));
                None
            }
            Err(_) => {
                self.fail(case, "hung (no answer in 30 s)");
                None
            }
        }
    }

    /// Runs a call whose outputs are tensors; an error must name `op`. Returns each output's
    /// shape, dtype and values (read as f64), or `None` for an error or a failure.
    fn call(
        &mut self,
        case: &str,
        op: &'static str,
        f: impl FnOnce() -> kiln::Result<Vec<Tensor>> + Send + 'static,
    ) -> Option<Vec<Out>> {
        let r = self.run(case, move || -> Result<Vec<Out>, KilnError> {
            let outs = f()?;
            outs.iter().map(Out::read).collect()
        })?;
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let text = e.to_string();
                // Resource errors, and an index found out of range when realized (named
                // by the kernel that reads it), are typed errors of their own.
                let resource = matches!(
                    e,
                    KilnError::OutOfMemory { .. }
                        | KilnError::TooLarge { .. }
                        | KilnError::IndexOutOfRange { .. }
                );
                if !resource && !op.split('|').any(|o| text.contains(o)) {
                    self.fail(case, format!("error does not name {op:?}: {text}"));
                }
                None
            }
        }
    }

    /// [`Sweep::call`] that must succeed.
    fn ok(
        &mut self,
        case: &str,
        op: &'static str,
        f: impl FnOnce() -> kiln::Result<Vec<Tensor>> + Send + 'static,
    ) -> Option<Vec<Out>> {
        let (tx, rx) = mpsc::channel();
        let r = self.call(case, op, move || {
            let r = f();
            if let Err(e) = &r {
                let _ = tx.send(e.to_string());
            }
            r
        });
        if let Ok(e) = rx.try_recv() {
            self.fail(case, format!("refused a legal input: {e}"));
        }
        r
    }

    /// [`Sweep::call`] that must fail with an error naming `op`.
    fn err(
        &mut self,
        case: &str,
        op: &'static str,
        f: impl FnOnce() -> kiln::Result<Vec<Tensor>> + Send + 'static,
    ) {
        if let Some(outs) = self.call(case, op, f) {
            let shapes: Vec<_> = outs.iter().map(|o| o.shape.clone()).collect();
            self.fail(case, format!("accepted, giving shapes {shapes:?}"));
        }
    }

    fn expect_shapes(&mut self, case: &str, outs: &Option<Vec<Out>>, want: &[&[usize]]) {
        if let Some(outs) = outs {
            let got: Vec<&[usize]> = outs.iter().map(|o| o.shape.as_slice()).collect();
            if got != want {
                self.fail(case, format!("shapes {got:?}, want {want:?}"));
            }
        }
    }

    fn expect_values(&mut self, case: &str, got: Option<&Out>, want: &[f64], tol: f64) {
        let Some(got) = got else { return };
        if !close(&got.values, want, tol) {
            self.fail(case, format!("values {:?}, want {want:?}", got.values));
        }
    }

    /// Both calls succeed with equal outputs, or both fail.
    fn same(&mut self, case: &str, a: &Option<Vec<Out>>, b: &Option<Vec<Out>>, tol: f64) {
        match (a, b) {
            (Some(a), Some(b)) => {
                if a.len() != b.len() {
                    self.fail(case, "different numbers of outputs");
                    return;
                }
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    if x.shape != y.shape || x.dtype != y.dtype || !close(&x.values, &y.values, tol)
                    {
                        self.fail(
                            case,
                            format!(
                                "output {i} differs from the contiguous input's: {:?} {:?} {:?} vs {:?} {:?} {:?}",
                                x.shape, x.dtype, x.values, y.shape, y.dtype, y.values
                            ),
                        );
                    }
                }
            }
            (None, None) => {}
            _ => self.fail(case, "the view and its contiguous copy disagree on success"),
        }
    }

    fn finish(self) {
        assert!(self.cases > 0);
        assert!(
            self.failures.is_empty(),
            "{}: {} of {} cases failed:\n{}",
            self.family,
            self.failures.len(),
            self.cases,
            self.failures.join("\n")
        );
    }
}

/// A realized output.
#[derive(Clone, Debug)]
struct Out {
    shape: Vec<usize>,
    dtype: DType,
    values: Vec<f64>,
}

impl Out {
    fn read(t: &Tensor) -> kiln::Result<Out> {
        Ok(Out {
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
            values: t.to_vec::<f64>()?,
        })
    }
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(&x, &y)| {
            (x.is_nan() && y.is_nan())
                || x == y
                || (x - y).abs() <= tol * (1.0 + x.abs().max(y.abs()))
        })
}

fn f64s(data: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(data.to_vec(), shape)
}

fn randn(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    Tensor::try_randn(shape, seed, dtype).unwrap()
}

fn empty(shape: &[usize], dtype: DType) -> Tensor {
    Tensor::try_zeros_dtype(shape, dtype).unwrap()
}

/// Non-contiguous views of `[.., m, n]` data with the shape `shape`: permuted, flipped,
/// stepped and expanded, each with a label.
fn views(shape: &[usize], seed: u64, dtype: DType) -> Vec<(&'static str, Tensor)> {
    let nd = shape.len();
    let mut out = Vec::new();
    // Transposed: the data of the transposed shape, transposed back.
    let mut tshape = shape.to_vec();
    tshape.swap(nd - 1, nd - 2);
    out.push((
        "transposed",
        randn(&tshape, seed, dtype).try_transpose(-1, -2).unwrap(),
    ));
    out.push((
        "flipped",
        randn(shape, seed + 1, dtype).try_flip([-1, -2]).unwrap(),
    ));
    // Every other row of twice as many.
    let mut wide = shape.to_vec();
    wide[nd - 2] *= 2;
    let ranges: Vec<(isize, isize, isize)> = wide
        .iter()
        .enumerate()
        .map(|(i, &d)| (0, d as isize, if i == nd - 2 { 2 } else { 1 }))
        .collect();
    out.push((
        "stepped",
        randn(&wide, seed + 2, dtype).try_slice(&ranges).unwrap(),
    ));
    // One matrix expanded over the batch.
    if nd >= 3 {
        let mut one = shape.to_vec();
        one[0] = 1;
        out.push((
            "expanded",
            randn(&one, seed + 3, dtype)
                .try_broadcast_to(shape)
                .unwrap(),
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------
// linalg
// ---------------------------------------------------------------------------------------

type Unary = fn(&Tensor) -> kiln::Result<Vec<Tensor>>;

/// Every one-matrix function of `kiln::linalg`, with the op name its errors carry.
fn linalg_unary() -> Vec<(&'static str, &'static str, Unary)> {
    vec![
        ("det", "linalg.det", |a| Ok(vec![linalg::det(a)?])),
        ("slogdet", "linalg.slogdet", |a| {
            let (s, l) = linalg::slogdet(a)?;
            Ok(vec![s, l])
        }),
        ("inv", "linalg.inv", |a| Ok(vec![linalg::inv(a)?])),
        ("cholesky", "linalg.cholesky", |a| {
            Ok(vec![linalg::cholesky(a)?])
        }),
        ("qr", "linalg.qr", |a| {
            let (q, r) = linalg::qr(a)?;
            Ok(vec![q, r])
        }),
        ("qr complete", "linalg.qr", |a| {
            let (q, r) = linalg::qr_mode(a, QrMode::Complete)?;
            Ok(vec![q, r])
        }),
        ("qr r", "linalg.qr", |a| {
            let (q, r) = linalg::qr_mode(a, QrMode::R)?;
            Ok(vec![q, r])
        }),
        ("eigh", "linalg.eigh", |a| {
            let (l, v) = linalg::eigh(a)?;
            Ok(vec![l, v])
        }),
        ("eigvalsh", "linalg.eigvalsh", |a| {
            Ok(vec![linalg::eigvalsh(a)?])
        }),
        ("svd", "linalg.svd", |a| {
            let (u, s, v) = linalg::svd(a)?;
            Ok(vec![u, s, v])
        }),
        ("svd_full", "linalg.svd", |a| {
            let (u, s, v) = linalg::svd_full(a)?;
            Ok(vec![u, s, v])
        }),
        ("svdvals", "linalg.svdvals", |a| {
            Ok(vec![linalg::svdvals(a)?])
        }),
        ("pinv", "linalg.pinv", |a| {
            Ok(vec![linalg::pinv(a, None, None, false)?])
        }),
        ("pinv hermitian", "linalg.pinv", |a| {
            Ok(vec![linalg::pinv(a, None, None, true)?])
        }),
        ("matrix_power 0", "linalg.matrix_power", |a| {
            Ok(vec![linalg::matrix_power(a, 0)?])
        }),
        ("matrix_power 3", "linalg.matrix_power", |a| {
            Ok(vec![linalg::matrix_power(a, 3)?])
        }),
        ("matrix_power -2", "linalg.matrix_power|linalg.inv", |a| {
            Ok(vec![linalg::matrix_power(a, -2)?])
        }),
        ("matrix_exp", "linalg.matrix_exp", |a| {
            Ok(vec![linalg::matrix_exp(a)?])
        }),
        ("lu_factor", "linalg.lu_factor", |a| {
            let (lu, p) = linalg::lu_factor(a)?;
            Ok(vec![lu, p])
        }),
        ("lu_factor_ex", "linalg.lu_factor_ex", |a| {
            let (lu, p, i) = linalg::lu_factor_ex(a)?;
            Ok(vec![lu, p, i])
        }),
        ("lu", "linalg.lu", |a| {
            let (p, l, u) = linalg::lu(a)?;
            Ok(vec![p, l, u])
        }),
        ("matrix_rank", "linalg.matrix_rank", |a| {
            Ok(vec![linalg::matrix_rank(a, None, None, false)?])
        }),
        ("cond", "linalg.cond", |a| Ok(vec![linalg::cond(a, None)?])),
        ("cond fro", "linalg.cond", |a| {
            Ok(vec![linalg::cond(a, Some(NormOrd::Fro))?])
        }),
        ("cond 1", "linalg.cond", |a| {
            Ok(vec![linalg::cond(a, Some(NormOrd::P(1.0)))?])
        }),
        ("matrix_norm fro", "linalg.matrix_norm", |a| {
            Ok(vec![linalg::matrix_norm(a, NormOrd::Fro, [-2, -1], false)?])
        }),
        ("matrix_norm nuc", "linalg.matrix_norm", |a| {
            Ok(vec![linalg::matrix_norm(a, NormOrd::Nuc, [-2, -1], false)?])
        }),
        ("matrix_norm inf", "linalg.matrix_norm", |a| {
            Ok(vec![linalg::matrix_norm(
                a,
                NormOrd::P(f64::INFINITY),
                [-2, -1],
                false,
            )?])
        }),
        ("matrix_norm -2", "linalg.matrix_norm", |a| {
            Ok(vec![linalg::matrix_norm(
                a,
                NormOrd::P(-2.0),
                [-2, -1],
                false,
            )?])
        }),
        ("norm", "linalg.norm", |a| {
            Ok(vec![linalg::norm(a, None, None, false)?])
        }),
    ]
}

/// Inputs every one-matrix function must survive (errors allowed, naming the op).
fn linalg_hostile() -> Vec<(&'static str, Tensor)> {
    let nan = f64s(&[f64::NAN, 1.0, 2.0, 3.0], &[2, 2]);
    let inf = f64s(&[f64::INFINITY, 1.0, 2.0, f64::NEG_INFINITY], &[2, 2]);
    vec![
        ("0-d", Tensor::from_vec(vec![2.0f64], ())),
        ("1-d", f64s(&[1.0, 2.0], &[2])),
        ("0x0", empty(&[0, 0], DType::F64)),
        ("batch of 0x0", empty(&[2, 0, 0], DType::F64)),
        ("empty batch", empty(&[0, 3, 3], DType::F64)),
        ("0x3", empty(&[0, 3], DType::F64)),
        ("3x0", empty(&[3, 0], DType::F64)),
        ("1x1", f64s(&[4.0], &[1, 1])),
        ("2x3", randn(&[2, 3], 1, DType::F64)),
        ("3x2", randn(&[3, 2], 2, DType::F64)),
        ("zeros", empty(&[3, 3], DType::F64)),
        ("nan", nan),
        ("all nan", f64s(&[f64::NAN; 4], &[2, 2])),
        ("inf", inf),
        ("huge", f64s(&[1e308, 1e308, -1e308, 1e308], &[2, 2])),
        ("tiny", f64s(&[1e-320, 0.0, 0.0, 1e-320], &[2, 2])),
        ("i64", Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2])),
        (
            "bool",
            Tensor::from_vec(vec![true, false, false, true], [2, 2]),
        ),
        ("f16", randn(&[3, 3], 3, DType::F16)),
        ("bf16", randn(&[3, 3], 4, DType::BF16)),
        ("f32", randn(&[2, 3, 3], 5, DType::F32)),
    ]
}

#[test]
fn linalg_survives_hostile_matrices() {
    let mut s = Sweep::new("linalg");
    for (name, op, f) in linalg_unary() {
        for (label, a) in linalg_hostile() {
            let case = format!("{name}({label})");
            s.call(&case, op, move || f(&a));
        }
    }
    s.finish();
}

#[test]
fn linalg_views_equal_their_contiguous_copies() {
    let mut s = Sweep::new("linalg views");
    for (name, op, f) in linalg_unary() {
        for dtype in [DType::F64, DType::F32] {
            let tol = if dtype == DType::F64 { 1e-9 } else { 1e-3 };
            for (label, v) in views(&[2, 3, 3], 11, dtype) {
                let case = format!("{name}({label} {dtype:?})");
                let c = v.try_contiguous().unwrap();
                // A symmetric positive-definite matrix for cholesky, from the view itself.
                let (v, c) = if name == "cholesky" {
                    let spd = |x: &Tensor| {
                        x.try_matmul(&x.try_transpose(-1, -2)?)?
                            .try_add(&Tensor::try_eye(3, dtype)?)
                    };
                    (spd(&v).unwrap(), spd(&c).unwrap())
                } else {
                    (v, c)
                };
                let a = s.call(&format!("{case} view"), op, move || f(&v));
                let b = s.call(&format!("{case} copy"), op, move || f(&c));
                s.same(&case, &a, &b, tol);
            }
        }
    }
    s.finish();
}

#[test]
fn linalg_empty_and_edge_values_match_pytorch() {
    let mut s = Sweep::new("linalg edges");
    let e = |shape: &[usize]| empty(shape, DType::F64);
    // det of a 0x0 matrix is 1; slogdet (1, 0).
    let r = s.ok("det(0x0)", "linalg.det", {
        let a = e(&[0, 0]);
        move || Ok(vec![linalg::det(&a)?])
    });
    s.expect_shapes("det(0x0)", &r, &[&[]]);
    s.expect_values("det(0x0)", r.as_ref().map(|o| &o[0]), &[1.0], 0.0);
    let r = s.ok("det(2x0x0)", "linalg.det", {
        let a = e(&[2, 0, 0]);
        move || Ok(vec![linalg::det(&a)?])
    });
    s.expect_values("det(2x0x0)", r.as_ref().map(|o| &o[0]), &[1.0, 1.0], 0.0);
    let r = s.ok("det(0x3x3)", "linalg.det", {
        let a = e(&[0, 3, 3]);
        move || Ok(vec![linalg::det(&a)?])
    });
    s.expect_shapes("det(0x3x3)", &r, &[&[0]]);
    let r = s.ok("slogdet(0x0)", "linalg.slogdet", {
        let a = e(&[0, 0]);
        move || {
            let (a, b) = linalg::slogdet(&a)?;
            Ok(vec![a, b])
        }
    });
    s.expect_values("slogdet(0x0) sign", r.as_ref().map(|o| &o[0]), &[1.0], 0.0);
    s.expect_values("slogdet(0x0) log", r.as_ref().map(|o| &o[1]), &[0.0], 0.0);
    // inv / cholesky / matrix_exp of 0x0 are 0x0.
    for (name, op, f) in [
        (
            "inv",
            "linalg.inv",
            linalg::inv as fn(&Tensor) -> kiln::Result<Tensor>,
        ),
        ("cholesky", "linalg.cholesky", linalg::cholesky),
        ("matrix_exp", "linalg.matrix_exp", linalg::matrix_exp),
    ] {
        for shape in [&[0usize, 0][..], &[2, 0, 0], &[0, 2, 2]] {
            let case = format!("{name}({shape:?})");
            let a = e(shape);
            let r = s.ok(&case, op, move || Ok(vec![f(&a)?]));
            s.expect_shapes(&case, &r, &[shape]);
        }
    }
    // pinv of m x n is n x m, empty ones included.
    for (shape, want) in [
        (&[0usize, 3][..], &[3usize, 0][..]),
        (&[3, 0], &[0, 3]),
        (&[2, 0, 4], &[2, 4, 0]),
        (&[0, 2, 3], &[0, 3, 2]),
    ] {
        let case = format!("pinv({shape:?})");
        let a = e(shape);
        let r = s.ok(&case, "linalg.pinv", move || {
            Ok(vec![linalg::pinv(&a, None, None, false)?])
        });
        s.expect_shapes(&case, &r, &[want]);
    }
    // matrix_power(A, 0) is the identity, an empty batch stays empty, and n far from 0
    // (i64::MIN cannot be negated) neither hangs nor panics.
    let r = s.ok("matrix_power(0x2x2, 0)", "linalg.matrix_power", {
        let a = e(&[0, 2, 2]);
        move || Ok(vec![linalg::matrix_power(&a, 0)?])
    });
    s.expect_shapes("matrix_power(0x2x2, 0)", &r, &[&[0, 2, 2]]);
    let r = s.ok("matrix_power(A, 0)", "linalg.matrix_power", {
        let a = randn(&[2, 2], 3, DType::F64);
        move || Ok(vec![linalg::matrix_power(&a, 0)?])
    });
    s.expect_values(
        "matrix_power(A, 0)",
        r.as_ref().map(|o| &o[0]),
        &[1.0, 0.0, 0.0, 1.0],
        0.0,
    );
    let r = s.ok("matrix_power(i64, 2)", "linalg.matrix_power", {
        let a = Tensor::from_vec(vec![1i64, 1, 0, 1], [2, 2]);
        move || Ok(vec![linalg::matrix_power(&a, 2)?])
    });
    s.expect_values(
        "matrix_power(i64, 2)",
        r.as_ref().map(|o| &o[0]),
        &[1.0, 2.0, 0.0, 1.0],
        0.0,
    );
    for n in [i64::MIN, i64::MIN + 1, i64::MAX, -1] {
        let case = format!("matrix_power(I, {n})");
        let r = s.call(&case, "linalg.matrix_power", move || {
            Ok(vec![linalg::matrix_power(
                &Tensor::try_eye(2, DType::F64)?,
                n,
            )?])
        });
        s.expect_values(&case, r.as_ref().map(|o| &o[0]), &[1.0, 0.0, 0.0, 1.0], 0.0);
    }
    // lstsq with zero rows: the least-norm solution is zero.
    let r = s.ok("lstsq(0x3, 0x2)", "linalg.lstsq", {
        let (a, b) = (e(&[0, 3]), e(&[0, 2]));
        move || {
            let l = linalg::lstsq(&a, &b, None, None)?;
            Ok(vec![l.solution, l.rank])
        }
    });
    s.expect_shapes("lstsq(0x3, 0x2)", &r, &[&[3, 2], &[]]);
    s.expect_values("lstsq(0x3, 0x2)", r.as_ref().map(|o| &o[0]), &[0.0; 6], 0.0);
    s.expect_values(
        "lstsq(0x3, 0x2) rank",
        r.as_ref().map(|o| &o[1]),
        &[0.0],
        0.0,
    );
    // Zero columns: a 0 x k solution.
    let r = s.ok("lstsq(3x0, 3x2)", "linalg.lstsq", {
        let (a, b) = (e(&[3, 0]), randn(&[3, 2], 1, DType::F64));
        move || Ok(vec![linalg::lstsq(&a, &b, None, None)?.solution])
    });
    s.expect_shapes("lstsq(3x0, 3x2)", &r, &[&[0, 2]]);
    for driver in [
        LstsqDriver::Gels,
        LstsqDriver::Gelsy,
        LstsqDriver::Gelsd,
        LstsqDriver::Gelss,
    ] {
        for (label, a, b) in [
            ("0x3 0x2", e(&[0, 3]), e(&[0, 2])),
            ("3x3 3x0", randn(&[3, 3], 2, DType::F64), e(&[3, 0])),
            ("empty batch", e(&[0, 3, 2]), e(&[0, 3, 1])),
            ("nan", f64s(&[f64::NAN, 1.0, 2.0, 3.0], &[2, 2]), e(&[2, 1])),
            (
                "f32 1-d b",
                randn(&[3, 2], 3, DType::F32),
                randn(&[3], 4, DType::F32),
            ),
            (
                "f64 a f32 b",
                randn(&[3, 2], 3, DType::F64),
                randn(&[3], 4, DType::F32),
            ),
            (
                "i64",
                Tensor::from_vec(vec![1i64, 0, 0, 1], [2, 2]),
                Tensor::from_vec(vec![1i64, 1], [2]),
            ),
            (
                "wrong rows",
                randn(&[3, 2], 3, DType::F64),
                randn(&[2, 2], 4, DType::F64),
            ),
            (
                "0-d b",
                randn(&[3, 2], 3, DType::F64),
                Tensor::from_vec(vec![1.0f64], ()),
            ),
        ] {
            let case = format!("lstsq({label}, {driver:?})");
            s.call(&case, "linalg.lstsq", move || {
                let l = linalg::lstsq(&a, &b, None, Some(driver))?;
                Ok(vec![l.solution, l.residuals, l.rank, l.singular_values])
            });
        }
        for rcond in [f64::NAN, -1.0, f64::INFINITY, 0.0] {
            let case = format!("lstsq(rcond {rcond}, {driver:?})");
            s.call(&case, "linalg.lstsq", move || {
                let l = linalg::lstsq(
                    &randn(&[3, 2], 5, DType::F64),
                    &randn(&[3, 1], 6, DType::F64),
                    Some(rcond),
                    Some(driver),
                )?;
                Ok(vec![l.solution, l.residuals, l.rank, l.singular_values])
            });
        }
    }
    // Tolerances that make no sense are refused or read as PyTorch reads them.
    for (atol, rtol) in [
        (Some(f64::NAN), None),
        (None, Some(f64::NAN)),
        (Some(-1.0), None),
        (None, Some(-1.0)),
        (Some(f64::INFINITY), None),
        (None, Some(f64::INFINITY)),
    ] {
        let case = format!("pinv(atol {atol:?}, rtol {rtol:?})");
        s.call(&case, "linalg.pinv", move || {
            Ok(vec![linalg::pinv(
                &randn(&[3, 3], 7, DType::F64),
                atol,
                rtol,
                false,
            )?])
        });
        let case = format!("matrix_rank(atol {atol:?}, rtol {rtol:?})");
        s.call(&case, "linalg.matrix_rank", move || {
            Ok(vec![linalg::matrix_rank(
                &randn(&[3, 3], 7, DType::F64),
                atol,
                rtol,
                false,
            )?])
        });
    }
    // svd / qr shapes of empty matrices.
    let r = s.ok("svd(0x3)", "linalg.svd", {
        let a = e(&[0, 3]);
        move || {
            let (u, s, v) = linalg::svd(&a)?;
            Ok(vec![u, s, v])
        }
    });
    s.expect_shapes("svd(0x3)", &r, &[&[0, 0], &[0], &[0, 3]]);
    let r = s.ok("svd_full(0x3)", "linalg.svd", {
        let a = e(&[0, 3]);
        move || {
            let (u, s, v) = linalg::svd_full(&a)?;
            Ok(vec![u, s, v])
        }
    });
    s.expect_shapes("svd_full(0x3)", &r, &[&[0, 0], &[0], &[3, 3]]);
    let r = s.ok("qr(3x0)", "linalg.qr", {
        let a = e(&[3, 0]);
        move || {
            let (q, r) = linalg::qr(&a)?;
            Ok(vec![q, r])
        }
    });
    s.expect_shapes("qr(3x0)", &r, &[&[3, 0], &[0, 0]]);
    let r = s.ok("qr complete(3x0)", "linalg.qr", {
        let a = e(&[3, 0]);
        move || {
            let (q, r) = linalg::qr_mode(&a, QrMode::Complete)?;
            Ok(vec![q, r])
        }
    });
    s.expect_shapes("qr complete(3x0)", &r, &[&[3, 3], &[3, 0]]);
    let r = s.ok("eigh(0x0)", "linalg.eigh", {
        let a = e(&[0, 0]);
        move || {
            let (l, v) = linalg::eigh(&a)?;
            Ok(vec![l, v])
        }
    });
    s.expect_shapes("eigh(0x0)", &r, &[&[0], &[0, 0]]);
    let r = s.ok("lu(3x0)", "linalg.lu", {
        let a = e(&[3, 0]);
        move || {
            let (p, l, u) = linalg::lu(&a)?;
            Ok(vec![p, l, u])
        }
    });
    s.expect_shapes("lu(3x0)", &r, &[&[3, 3], &[3, 0], &[0, 0]]);
    let r = s.ok("lu_factor(0x0)", "linalg.lu_factor", {
        let a = e(&[0, 0]);
        move || {
            let (lu, p) = linalg::lu_factor(&a)?;
            Ok(vec![lu, p])
        }
    });
    s.expect_shapes("lu_factor(0x0)", &r, &[&[0, 0], &[0]]);
    if let Some(o) = &r {
        assert_eq!(o[1].dtype, DType::I32);
    }
    // rank of an empty matrix is 0; PyTorch's cond of an empty matrix is 0.
    let r = s.ok("matrix_rank(0x3)", "linalg.matrix_rank", {
        let a = e(&[0, 3]);
        move || Ok(vec![linalg::matrix_rank(&a, None, None, false)?])
    });
    s.expect_values("matrix_rank(0x3)", r.as_ref().map(|o| &o[0]), &[0.0], 0.0);
    let r = s.call("cond(0x0)", "linalg.cond", {
        let a = e(&[0, 0]);
        move || Ok(vec![linalg::cond(&a, None)?])
    });
    s.expect_values("cond(0x0)", r.as_ref().map(|o| &o[0]), &[0.0], 0.0);
    // NaN propagates through det, inv and matrix_exp, as LAPACK's does.
    for (name, op, f) in [
        (
            "det",
            "linalg.det",
            linalg::det as fn(&Tensor) -> kiln::Result<Tensor>,
        ),
        ("inv", "linalg.inv", linalg::inv),
        ("matrix_exp", "linalg.matrix_exp", linalg::matrix_exp),
    ] {
        let case = format!("{name}(nan)");
        let r = s.call(&case, op, move || {
            Ok(vec![f(&f64s(&[f64::NAN, 1.0, 2.0, 3.0], &[2, 2]))?])
        });
        if let Some(o) = &r
            && !o[0].values.iter().any(|v| v.is_nan())
        {
            s.fail(&case, format!("NaN did not propagate: {:?}", o[0].values));
        }
    }
    // Two-matrix functions with empty and broadcast operands.
    for (label, a, b) in [
        ("0x0 0x2", e(&[0, 0]), e(&[0, 2])),
        (
            "3x3 3x0",
            Tensor::try_eye(3, DType::F64).unwrap(),
            e(&[3, 0]),
        ),
        ("batch 0", e(&[0, 2, 2]), e(&[0, 2, 1])),
        (
            "broadcast",
            Tensor::try_eye(2, DType::F64).unwrap(),
            randn(&[4, 2, 3], 1, DType::F64),
        ),
        (
            "1-d b",
            Tensor::try_eye(2, DType::F64).unwrap(),
            randn(&[2], 1, DType::F64),
        ),
        (
            "0-d b",
            Tensor::try_eye(2, DType::F64).unwrap(),
            Tensor::from_vec(vec![1.0f64], ()),
        ),
        (
            "mismatch",
            Tensor::try_eye(2, DType::F64).unwrap(),
            randn(&[3, 1], 1, DType::F64),
        ),
        (
            "dtypes",
            Tensor::try_eye(2, DType::F64).unwrap(),
            randn(&[2, 1], 1, DType::F32),
        ),
        (
            "i64",
            Tensor::from_vec(vec![1i64, 0, 0, 1], [2, 2]),
            Tensor::from_vec(vec![1i64, 1], [2, 1]),
        ),
        (
            "nonsquare",
            randn(&[2, 3], 1, DType::F64),
            randn(&[2, 1], 1, DType::F64),
        ),
        ("singular", e(&[2, 2]), randn(&[2, 1], 1, DType::F64)),
        (
            "f16",
            randn(&[2, 2], 1, DType::F16),
            randn(&[2, 1], 1, DType::F16),
        ),
        (
            "huge batch",
            randn(&[1, 2, 2], 1, DType::F64)
                .try_broadcast_to([1usize << 40, 2, 2])
                .unwrap(),
            randn(&[2, 1], 1, DType::F64),
        ),
    ] {
        let (a2, b2, a3, b3, a4, b4) = (
            a.clone(),
            b.clone(),
            a.clone(),
            b.clone(),
            a.clone(),
            b.clone(),
        );
        s.call(&format!("solve({label})"), "linalg.solve", move || {
            Ok(vec![linalg::solve(&a, &b)?])
        });
        for (upper, left, unit) in [(true, true, false), (false, false, true)] {
            let (a, b) = (a2.clone(), b2.clone());
            s.call(
                &format!("solve_triangular({label}, {upper} {left} {unit})"),
                "linalg.solve_triangular",
                move || Ok(vec![linalg::solve_triangular(&a, &b, upper, left, unit)?]),
            );
        }
        s.call(&format!("lu_solve({label})"), "linalg.lu", move || {
            let (lu, piv, _) = linalg::lu_factor_ex(&a3)?;
            Ok(vec![linalg::lu_solve(&lu, &piv, &b3, true, false)?])
        });
        if b4.ndim() >= 2 {
            s.call(
                &format!("lu_solve adjoint right({label})"),
                "linalg.lu",
                move || {
                    let (lu, piv, _) = linalg::lu_factor_ex(&a4)?;
                    Ok(vec![linalg::lu_solve(
                        &lu,
                        &piv,
                        &b4.try_transpose(-1, -2)?,
                        false,
                        true,
                    )?])
                },
            );
        }
    }
    // Pivots that are not a permutation are refused, not read out of bounds.
    for piv in [
        vec![0i32, 2],
        vec![3, 2],
        vec![-1, 2],
        vec![i32::MAX, i32::MIN],
    ] {
        let case = format!("lu_solve(pivots {piv:?})");
        s.call(&case, "linalg.lu_solve", move || {
            let lu = Tensor::try_eye(2, DType::F64)?;
            let p = Tensor::from_vec(piv, [2]);
            Ok(vec![linalg::lu_solve(
                &lu,
                &p,
                &randn(&[2, 1], 1, DType::F64),
                true,
                false,
            )?])
        });
    }
    for piv in [
        Tensor::from_vec(vec![1i64, 2], [2]),
        Tensor::from_vec(vec![1.0f32, 2.0], [2]),
        Tensor::from_vec(vec![1i32], [1]),
        Tensor::from_vec(vec![1i32, 2, 3], [3]),
    ] {
        let case = format!("lu_solve(pivots {:?} {:?})", piv.dtype(), piv.shape());
        s.call(&case, "linalg.lu_solve", move || {
            let lu = Tensor::try_eye(2, DType::F64)?;
            Ok(vec![linalg::lu_solve(
                &lu,
                &piv,
                &randn(&[2, 1], 1, DType::F64),
                true,
                false,
            )?])
        });
    }
    // vector_norm orders and axes.
    for ord in [
        f64::NAN,
        0.0,
        -1.0,
        0.5,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e300,
    ] {
        for (label, x) in [
            ("empty", e(&[0, 3])),
            ("0-d", Tensor::from_vec(vec![-2.0f64], ())),
            ("nan", f64s(&[f64::NAN, 1.0], &[2])),
            ("f16", randn(&[4], 1, DType::F16)),
            ("i64", Tensor::from_vec(vec![1i64, 2], [2])),
        ] {
            let case = format!("vector_norm({label}, {ord})");
            s.call(&case, "linalg.vector_norm", move || {
                Ok(vec![linalg::vector_norm(&x, ord, .., false)?])
            });
        }
    }
    let r = s.ok("vector_norm(empty, 2)", "linalg.vector_norm", {
        let x = e(&[0, 3]);
        move || Ok(vec![linalg::vector_norm(&x, 2.0, .., false)?])
    });
    s.expect_values(
        "vector_norm(empty, 2)",
        r.as_ref().map(|o| &o[0]),
        &[0.0],
        0.0,
    );
    for dims in [vec![5isize], vec![0, 0], vec![-3]] {
        let case = format!("vector_norm(dims {dims:?})");
        s.err(&case, "linalg.vector_norm", move || {
            Ok(vec![linalg::vector_norm(
                &randn(&[2, 2], 1, DType::F64),
                2.0,
                dims.as_slice(),
                false,
            )?])
        });
    }
    for ord in [NormOrd::P(3.0), NormOrd::P(f64::NAN), NormOrd::P(0.0)] {
        let case = format!("matrix_norm({ord:?})");
        s.err(&case, "linalg.matrix_norm", move || {
            Ok(vec![linalg::matrix_norm(
                &randn(&[2, 2], 1, DType::F64),
                ord,
                [-2, -1],
                false,
            )?])
        });
    }
    for dims in [[0isize, 0], [0, 5], [-3, 1]] {
        let case = format!("matrix_norm(dims {dims:?})");
        s.err(&case, "linalg.matrix_norm", move || {
            Ok(vec![linalg::matrix_norm(
                &randn(&[2, 2], 1, DType::F64),
                NormOrd::Fro,
                dims,
                false,
            )?])
        });
    }
    s.finish();
}

#[test]
fn host_read_linalg_refuses_an_absurd_expanded_batch() {
    // 2^40 matrices expanded from one: reading them onto the host must fail with a
    // resource error at once, not allocate or hang.
    let mut s = Sweep::new("linalg huge batch");
    for (name, op, f) in [
        (
            "det",
            "linalg.det",
            linalg::det as fn(&Tensor) -> kiln::Result<Tensor>,
        ),
        ("inv", "linalg.inv", linalg::inv),
        ("svdvals", "linalg.svdvals", linalg::svdvals),
        ("matrix_exp", "linalg.matrix_exp", linalg::matrix_exp),
    ] {
        let a = randn(&[1, 2, 2], 6, DType::F64)
            .try_broadcast_to([1usize << 40, 2, 2])
            .unwrap();
        s.err(name, op, move || Ok(vec![f(&a)?]));
    }
    s.finish();
}

#[test]
fn matrix_norm_of_an_empty_matrix_names_the_op() {
    // Used to fail inside the inner `max`/`min` reduction, whose error named `max`/`min`
    // rather than `linalg.matrix_norm`. PyTorch refuses these too (its `amax` of nothing).
    for (shape, ord) in [
        (&[0usize, 0][..], NormOrd::P(f64::INFINITY)),
        (&[0, 3], NormOrd::P(f64::INFINITY)),
        (&[3, 0], NormOrd::P(1.0)),
        (&[2, 0, 0], NormOrd::P(-2.0)),
        (&[3, 0], NormOrd::P(2.0)),
    ] {
        let e = linalg::matrix_norm(&empty(shape, DType::F64), ord, [-2, -1], false)
            .expect_err("an empty max/min");
        assert!(
            matches!(
                e,
                KilnError::InvalidArgument {
                    op: "linalg.matrix_norm",
                    ..
                }
            ),
            "{e}"
        );
    }
    // The ones with something to pick from still work: a row-sum max over 3 empty rows
    // is 0, as in PyTorch; Fro and Nuc of empty matrices are 0.
    for (shape, ord) in [
        (&[3usize, 0][..], NormOrd::P(f64::INFINITY)),
        (&[0, 3], NormOrd::P(1.0)),
        (&[0, 0], NormOrd::Fro),
        (&[0, 3], NormOrd::Nuc),
    ] {
        let v = linalg::matrix_norm(&empty(shape, DType::F64), ord, [-2, -1], false)
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        assert_eq!(v, vec![0.0], "{shape:?} {ord:?}");
    }
}

// ---------------------------------------------------------------------------------------
// histograms
// ---------------------------------------------------------------------------------------

#[test]
fn histograms_survive_hostile_inputs() {
    let mut s = Sweep::new("histograms");
    let data = |v: &[f32]| Tensor::from_vec(v.to_vec(), [v.len()]);
    let inputs = || -> Vec<(&'static str, Tensor)> {
        vec![
            ("empty", empty(&[0], DType::F32)),
            ("empty 2-d", empty(&[3, 0], DType::F32)),
            ("0-d", Tensor::from_vec(vec![0.5f32], ())),
            ("nan", data(&[f32::NAN, 0.5, 0.25])),
            ("all nan", data(&[f32::NAN, f32::NAN])),
            ("inf", data(&[f32::INFINITY, 0.5, f32::NEG_INFINITY])),
            ("one value", data(&[2.0, 2.0, 2.0])),
            ("f16", randn(&[7], 1, DType::F16)),
            ("bf16", randn(&[7], 2, DType::BF16)),
            ("f64", randn(&[7], 3, DType::F64)),
            ("i64", Tensor::from_vec(vec![1i64, 2, 3], [3])),
            ("bool", Tensor::from_vec(vec![true, false], [2])),
            (
                "permuted",
                randn(&[3, 4], 4, DType::F32).try_transpose(0, 1).unwrap(),
            ),
            ("flipped", randn(&[5], 5, DType::F32).try_flip([0]).unwrap()),
            (
                "expanded",
                randn(&[1, 3], 6, DType::F32)
                    .try_broadcast_to([4, 3])
                    .unwrap(),
            ),
        ]
    };
    for (label, x) in inputs() {
        for (bins, lo, hi) in [
            (4, 0.0, 1.0),
            (1, 0.0, 0.0),
            (0, 0.0, 1.0),
            (3, 1.0, 0.0),
            (3, f64::NAN, 1.0),
            (3, 0.0, f64::INFINITY),
            (3, -1e300, 1e300),
            (1usize << 40, 0.0, 1.0),
            (usize::MAX, 0.0, 1.0),
        ] {
            let xc = x.clone();
            let case = format!("histc({label}, {bins}, {lo}, {hi})");
            s.call(&case, "histc", move || {
                Ok(vec![xc.try_histc(bins, lo, hi)?])
            });
            let xc = x.clone();
            let case = format!("histogram({label}, {bins}, {lo}, {hi})");
            s.call(&case, "histogram", move || {
                let (h, e) = xc.try_histogram(bins, Some((lo, hi)), None, true)?;
                Ok(vec![h, e])
            });
        }
        let xc = x.clone();
        s.call(
            &format!("histogram({label}, no range)"),
            "histogram",
            move || {
                let (h, e) = xc.try_histogram(3, None, None, false)?;
                Ok(vec![h, e])
            },
        );
        let xc = x.clone();
        s.call(
            &format!("histogram({label}, weight)"),
            "histogram",
            move || {
                let w = Tensor::try_full_on(xc.shape(), 1.0, xc.dtype(), xc.device())?;
                let (h, e) = xc.try_histogram(3, Some((0.0, 1.0)), Some(&w), true)?;
                Ok(vec![h, e])
            },
        );
        let xc = x.clone();
        s.call(
            &format!("histogram_with_edges({label})"),
            "histogram",
            move || {
                let edges = Tensor::from_vec(vec![0.0f32, 0.5, 1.0], [3]).try_cast(xc.dtype())?;
                let (h, e) = xc.try_histogram_with_edges(&edges, None, false)?;
                Ok(vec![h, e])
            },
        );
        let xc = x.clone();
        s.call(&format!("histogramdd({label})"), "histogramdd", move || {
            let (h, mut e) = xc.try_histogramdd(&[2], None, None, false)?;
            e.insert(0, h);
            Ok(e)
        });
    }
    // Edges that are not edges.
    for (label, edges) in [
        ("one edge", Tensor::from_vec(vec![0.0f32], [1])),
        ("no edges", empty(&[0], DType::F32)),
        ("decreasing", Tensor::from_vec(vec![1.0f32, 0.0], [2])),
        (
            "nan edge",
            Tensor::from_vec(vec![0.0f32, f32::NAN, 1.0], [3]),
        ),
        ("2-d", Tensor::from_vec(vec![0.0f32, 1.0], [1, 2])),
        ("f64 edges", Tensor::from_vec(vec![0.0f64, 1.0], [2])),
        (
            "inf edges",
            Tensor::from_vec(vec![f32::NEG_INFINITY, 0.0, f32::INFINITY], [3]),
        ),
    ] {
        let case = format!("histogram_with_edges({label})");
        s.call(&case, "histogram", move || {
            let (h, e) =
                randn(&[6], 7, DType::F32).try_histogram_with_edges(&edges, None, false)?;
            Ok(vec![h, e])
        });
    }
    // histogramdd arguments.
    let pts = || randn(&[5, 2], 8, DType::F32);
    for (label, bins, range) in [
        ("no bins", vec![], None),
        ("too many bins", vec![2, 2, 2], None),
        ("zero bins", vec![0, 2], None),
        ("range count", vec![2, 2], Some(vec![(0.0, 1.0)])),
        ("bad range", vec![2, 2], Some(vec![(1.0, 0.0), (0.0, 1.0)])),
        (
            "nan range",
            vec![2, 2],
            Some(vec![(f64::NAN, 1.0), (0.0, 1.0)]),
        ),
        ("huge bins", vec![1 << 30, 1 << 30], None),
    ] {
        let case = format!("histogramdd({label})");
        s.call(&case, "histogramdd", move || {
            let (h, mut e) = pts().try_histogramdd(&bins, range.as_deref(), None, false)?;
            e.insert(0, h);
            Ok(e)
        });
    }
    for (label, x) in [
        ("0-d points", Tensor::from_vec(vec![1.0f32], ())),
        ("no dims", empty(&[4, 0], DType::F32)),
        ("no points", empty(&[0, 2], DType::F32)),
    ] {
        let case = format!("histogramdd({label})");
        s.call(&case, "histogramdd", move || {
            let (h, mut e) = x.try_histogramdd(&[2], None, None, false)?;
            e.insert(0, h);
            Ok(e)
        });
    }
    // bincount.
    for (label, x, w, minlength) in [
        ("empty", empty(&[0], DType::I64), None, 0usize),
        ("empty minlength", empty(&[0], DType::I64), None, 3),
        (
            "empty weights",
            empty(&[0], DType::I64),
            Some(empty(&[0], DType::F32)),
            2,
        ),
        ("negative", Tensor::from_vec(vec![1i64, -1], [2]), None, 0),
        ("i64::MAX", Tensor::from_vec(vec![i64::MAX], [1]), None, 0),
        (
            "huge minlength",
            Tensor::from_vec(vec![1i64], [1]),
            None,
            usize::MAX,
        ),
        (
            "huge value",
            Tensor::from_vec(vec![1i64 << 50], [1]),
            None,
            0,
        ),
        ("u8", Tensor::from_vec(vec![1u8, 255], [2]), None, 0),
        ("i32", Tensor::from_vec(vec![3i32, 0], [2]), None, 0),
        ("float", Tensor::from_vec(vec![1.0f32], [1]), None, 0),
        ("bool", Tensor::from_vec(vec![true], [1]), None, 0),
        ("2-d", Tensor::from_vec(vec![1i64, 2], [1, 2]), None, 0),
        ("0-d", Tensor::from_vec(vec![1i64], ()), None, 0),
        (
            "weights short",
            Tensor::from_vec(vec![1i64, 2], [2]),
            Some(empty(&[1], DType::F32)),
            0,
        ),
        (
            "weights i64",
            Tensor::from_vec(vec![1i64, 2], [2]),
            Some(Tensor::from_vec(vec![5i64, 7], [2])),
            0,
        ),
        (
            "weights f16",
            Tensor::from_vec(vec![1i64, 1], [2]),
            Some(
                Tensor::from_vec(vec![1.0f32, 2.0], [2])
                    .try_cast(DType::F16)
                    .unwrap(),
            ),
            0,
        ),
        (
            "weights nan",
            Tensor::from_vec(vec![1i64, 1], [2]),
            Some(Tensor::from_vec(vec![f32::NAN, 2.0], [2])),
            0,
        ),
        (
            "stepped",
            Tensor::from_vec(vec![0i64, 9, 2, 9, 2], [5])
                .try_slice(&[(0, 5, 2)])
                .unwrap(),
            None,
            0,
        ),
        (
            "expanded",
            Tensor::from_vec(vec![3i64], [1])
                .try_broadcast_to([4])
                .unwrap(),
            None,
            0,
        ),
    ] {
        let case = format!("bincount({label})");
        s.call(&case, "bincount", move || {
            Ok(vec![x.try_bincount(w.as_ref(), minlength)?])
        });
    }
    s.finish();
}

#[test]
fn histogram_edge_values_match_pytorch() {
    let mut s = Sweep::new("histogram edges");
    // The histogram of nothing is all zeros, with the given range's edges.
    let r = s.ok("histc(empty)", "histc", || {
        Ok(vec![empty(&[0], DType::F32).try_histc(3, 0.0, 3.0)?])
    });
    s.expect_values("histc(empty)", r.as_ref().map(|o| &o[0]), &[0.0; 3], 0.0);
    let r = s.ok("histogram(empty)", "histogram", || {
        let (h, e) = empty(&[0], DType::F32).try_histogram(2, None, None, false)?;
        Ok(vec![h, e])
    });
    s.expect_values(
        "histogram(empty)",
        r.as_ref().map(|o| &o[0]),
        &[0.0; 2],
        0.0,
    );
    s.expect_values(
        "histogram(empty) edges",
        r.as_ref().map(|o| &o[1]),
        &[0.0, 0.5, 1.0],
        0.0,
    );
    // Density of nothing: 0/0, NaN in PyTorch.
    let r = s.ok("histogram(empty, density)", "histogram", || {
        let (h, _) = empty(&[0], DType::F32).try_histogram(2, Some((0.0, 1.0)), None, true)?;
        Ok(vec![h])
    });
    s.expect_values(
        "histogram(empty, density)",
        r.as_ref().map(|o| &o[0]),
        &[f64::NAN; 2],
        0.0,
    );
    let r = s.ok("bincount(empty, minlength 3)", "bincount", || {
        Ok(vec![empty(&[0], DType::I64).try_bincount(None, 3)?])
    });
    s.expect_values(
        "bincount(empty, minlength 3)",
        r.as_ref().map(|o| &o[0]),
        &[0.0; 3],
        0.0,
    );
    let r = s.ok("bincount(stepped)", "bincount", || {
        let x = Tensor::from_vec(vec![0i64, 9, 2, 9, 2], [5]).try_slice(&[(0, 5, 2)])?;
        Ok(vec![x.try_bincount(None, 0)?])
    });
    s.expect_values(
        "bincount(stepped)",
        r.as_ref().map(|o| &o[0]),
        &[1.0, 0.0, 2.0],
        0.0,
    );
    // NaN and infinities are not counted; values outside the range neither.
    let r = s.ok("histc(nan inf)", "histc", || {
        let x = Tensor::from_vec(vec![f32::NAN, f32::INFINITY, 0.5, -7.0, 1.0], [5]);
        Ok(vec![x.try_histc(2, 0.0, 1.0)?])
    });
    s.expect_values(
        "histc(nan inf)",
        r.as_ref().map(|o| &o[0]),
        &[0.0, 2.0],
        0.0,
    );
    // A view counts as its contiguous copy.
    for (label, v) in [
        (
            "permuted",
            randn(&[3, 4], 4, DType::F32).try_transpose(0, 1).unwrap(),
        ),
        ("flipped", randn(&[9], 5, DType::F32).try_flip([0]).unwrap()),
        (
            "expanded",
            randn(&[1, 3], 6, DType::F32)
                .try_broadcast_to([4, 3])
                .unwrap(),
        ),
        (
            "stepped",
            randn(&[10], 6, DType::F64)
                .try_slice(&[(1, 10, 3)])
                .unwrap(),
        ),
    ] {
        let c = v.try_contiguous().unwrap();
        let f = |x: Tensor| {
            move || {
                let (h, e) = x.try_histogram(4, None, None, false)?;
                Ok(vec![h, e, x.try_histc(3, -1.0, 1.0)?])
            }
        };
        let a = s.ok(&format!("{label} view"), "histogram", f(v));
        let b = s.ok(&format!("{label} copy"), "histogram", f(c));
        s.same(label, &a, &b, 0.0);
    }
    s.finish();
}

// ---------------------------------------------------------------------------------------
// embedding_bag, scatter_reduce, index_reduce
// ---------------------------------------------------------------------------------------

#[test]
fn embedding_bag_survives_hostile_inputs() {
    use kiln::nn::functional::{EmbeddingBagMode, embedding_bag};
    let mut s = Sweep::new("embedding_bag");
    let w = || randn(&[5, 3], 1, DType::F32);
    let ids = |v: &[i64]| Tensor::from_vec(v.to_vec(), [v.len()]);
    for mode in [
        EmbeddingBagMode::Sum,
        EmbeddingBagMode::Mean,
        EmbeddingBagMode::Max,
    ] {
        for (label, input, offsets, weight, last, pad) in [
            ("no ids", ids(&[]), Some(ids(&[0])), w(), false, None),
            ("no bags", ids(&[]), Some(ids(&[])), w(), false, None),
            ("no bags last", ids(&[1]), Some(ids(&[])), w(), true, None),
            (
                "only last offset",
                ids(&[1]),
                Some(ids(&[0])),
                w(),
                true,
                None,
            ),
            (
                "empty bags",
                ids(&[1, 2]),
                Some(ids(&[0, 0, 2, 2])),
                w(),
                false,
                None,
            ),
            (
                "offset past end",
                ids(&[1, 2]),
                Some(ids(&[0, 3])),
                w(),
                false,
                None,
            ),
            (
                "offset negative",
                ids(&[1, 2]),
                Some(ids(&[-1, 1])),
                w(),
                false,
                None,
            ),
            (
                "offset not 0",
                ids(&[1, 2]),
                Some(ids(&[1])),
                w(),
                false,
                None,
            ),
            (
                "decreasing",
                ids(&[1, 2, 3]),
                Some(ids(&[0, 2, 1])),
                w(),
                false,
                None,
            ),
            (
                "offsets 2-d",
                ids(&[1, 2]),
                Some(Tensor::from_vec(vec![0i64], [1, 1])),
                w(),
                false,
                None,
            ),
            (
                "offsets float",
                ids(&[1, 2]),
                Some(Tensor::from_vec(vec![0.0f32], [1])),
                w(),
                false,
                None,
            ),
            ("id too large", ids(&[5]), Some(ids(&[0])), w(), false, None),
            ("id negative", ids(&[-1]), Some(ids(&[0])), w(), false, None),
            (
                "id i64::MIN",
                ids(&[i64::MIN]),
                Some(ids(&[0])),
                w(),
                false,
                None,
            ),
            (
                "float ids",
                Tensor::from_vec(vec![1.0f32], [1]),
                Some(ids(&[0])),
                w(),
                false,
                None,
            ),
            (
                "2-d ids",
                Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]),
                None,
                w(),
                false,
                None,
            ),
            (
                "2-d ids offsets",
                Tensor::from_vec(vec![1i64, 2], [1, 2]),
                Some(ids(&[0])),
                w(),
                false,
                None,
            ),
            (
                "2-d no columns",
                empty(&[3, 0], DType::I64),
                None,
                w(),
                false,
                None,
            ),
            (
                "2-d no rows",
                empty(&[0, 2], DType::I64),
                None,
                w(),
                false,
                None,
            ),
            ("1-d no offsets", ids(&[1]), None, w(), false, None),
            (
                "0-d ids",
                Tensor::from_vec(vec![1i64], ()),
                None,
                w(),
                false,
                None,
            ),
            (
                "3-d ids",
                empty(&[1, 1, 1], DType::I64),
                None,
                w(),
                false,
                None,
            ),
            (
                "empty table",
                ids(&[0]),
                Some(ids(&[0])),
                empty(&[0, 3], DType::F32),
                false,
                None,
            ),
            (
                "zero dim table",
                ids(&[0, 1]),
                Some(ids(&[0, 1])),
                empty(&[5, 0], DType::F32),
                false,
                None,
            ),
            (
                "1-d table",
                ids(&[0]),
                Some(ids(&[0])),
                randn(&[5], 1, DType::F32),
                false,
                None,
            ),
            (
                "int table",
                ids(&[0]),
                Some(ids(&[0])),
                Tensor::from_vec(vec![1i64, 2], [2, 1]),
                false,
                None,
            ),
            (
                "f16 table",
                ids(&[0, 4]),
                Some(ids(&[0, 1])),
                randn(&[5, 3], 1, DType::F16),
                false,
                None,
            ),
            (
                "f64 table",
                ids(&[0, 4]),
                Some(ids(&[0, 1])),
                randn(&[5, 3], 1, DType::F64),
                false,
                None,
            ),
            (
                "nan table",
                ids(&[0, 1]),
                Some(ids(&[0])),
                f64s(&[f64::NAN, 1.0, 2.0, 3.0], &[2, 2]),
                false,
                None,
            ),
            (
                "padding",
                ids(&[2, 2, 1]),
                Some(ids(&[0, 2])),
                w(),
                false,
                Some(2),
            ),
            (
                "padding negative",
                ids(&[4, 1]),
                Some(ids(&[0, 1])),
                w(),
                false,
                Some(-1),
            ),
            (
                "padding out of range",
                ids(&[1]),
                Some(ids(&[0])),
                w(),
                false,
                Some(5),
            ),
            (
                "padding far negative",
                ids(&[1]),
                Some(ids(&[0])),
                w(),
                false,
                Some(i64::MIN),
            ),
            (
                "transposed table",
                ids(&[0, 2]),
                Some(ids(&[0, 1])),
                randn(&[3, 5], 1, DType::F32).try_transpose(0, 1).unwrap(),
                false,
                None,
            ),
            (
                "stepped ids",
                ids(&[0, 9, 1, 9, 4]).try_slice(&[(0, 5, 2)]).unwrap(),
                Some(ids(&[0, 1])),
                w(),
                false,
                None,
            ),
        ] {
            let case = format!("embedding_bag({label}, {mode:?})");
            s.call(&case, "embedding_bag", move || {
                Ok(vec![embedding_bag(
                    &input,
                    &weight,
                    offsets.as_ref(),
                    mode,
                    None,
                    last,
                    pad,
                )?])
            });
        }
    }
    // per_sample_weights.
    for (label, psw, mode) in [
        (
            "ok",
            Some(Tensor::from_vec(vec![1.0f32, 2.0], [2])),
            EmbeddingBagMode::Sum,
        ),
        (
            "mean",
            Some(Tensor::from_vec(vec![1.0f32, 2.0], [2])),
            EmbeddingBagMode::Mean,
        ),
        (
            "short",
            Some(Tensor::from_vec(vec![1.0f32], [1])),
            EmbeddingBagMode::Sum,
        ),
        (
            "i64",
            Some(Tensor::from_vec(vec![1i64, 2], [2])),
            EmbeddingBagMode::Sum,
        ),
        (
            "f64",
            Some(Tensor::from_vec(vec![1.0f64, 2.0], [2])),
            EmbeddingBagMode::Sum,
        ),
        (
            "nan",
            Some(Tensor::from_vec(vec![f32::NAN, 2.0], [2])),
            EmbeddingBagMode::Sum,
        ),
    ] {
        let case = format!("embedding_bag(per_sample_weights {label})");
        s.call(&case, "embedding_bag", move || {
            Ok(vec![embedding_bag(
                &ids(&[1, 3]),
                &w(),
                Some(&ids(&[0, 1])),
                mode,
                psw.as_ref(),
                false,
                None,
            )?])
        });
    }
    // Empty bags are zero in every mode, as PyTorch.
    for mode in [
        EmbeddingBagMode::Sum,
        EmbeddingBagMode::Mean,
        EmbeddingBagMode::Max,
    ] {
        let case = format!("embedding_bag(empty bags, {mode:?})");
        let r = s.ok(&case, "embedding_bag", move || {
            let w = f64s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
            Ok(vec![embedding_bag(
                &ids(&[1]),
                &w,
                Some(&ids(&[0, 0, 1])),
                mode,
                None,
                false,
                None,
            )?])
        });
        s.expect_shapes(&case, &r, &[&[3, 2]]);
        s.expect_values(
            &case,
            r.as_ref().map(|o| &o[0]),
            &[0.0, 0.0, 3.0, 4.0, 0.0, 0.0],
            0.0,
        );
    }
    // A view of ids or table equals its contiguous copy.
    let table = randn(&[3, 5], 2, DType::F32).try_transpose(0, 1).unwrap();
    let bags = Tensor::from_vec(vec![0i64, 4, 1, 3, 2, 0], [2, 3])
        .try_flip([1])
        .unwrap();
    for mode in [
        EmbeddingBagMode::Sum,
        EmbeddingBagMode::Mean,
        EmbeddingBagMode::Max,
    ] {
        let (t, b) = (table.clone(), bags.clone());
        let a = s.ok("view", "embedding_bag", move || {
            Ok(vec![embedding_bag(&b, &t, None, mode, None, false, None)?])
        });
        let (t, b) = (
            table.try_contiguous().unwrap(),
            bags.try_contiguous().unwrap(),
        );
        let c = s.ok("copy", "embedding_bag", move || {
            Ok(vec![embedding_bag(&b, &t, None, mode, None, false, None)?])
        });
        s.same(&format!("embedding_bag views {mode:?}"), &a, &c, 0.0);
    }
    s.finish();
}

#[test]
fn scatter_and_index_reductions_survive_hostile_inputs() {
    let mut s = Sweep::new("scatter/index reduce");
    let reductions = ["sum", "prod", "mean", "amax", "amin", "max", "", "SUM"];
    let i64s = |v: &[i64], shape: &[usize]| Tensor::from_vec(v.to_vec(), shape);
    for reduce in reductions {
        for include_self in [true, false] {
            for (label, x, dim, index, src) in [
                (
                    "ok",
                    randn(&[3, 2], 1, DType::F32),
                    0isize,
                    i64s(&[0, 2, 0, 0], &[2, 2]),
                    randn(&[2, 2], 2, DType::F32),
                ),
                (
                    "empty index",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    empty(&[0, 2], DType::I64),
                    randn(&[2, 2], 2, DType::F32),
                ),
                (
                    "empty self",
                    empty(&[0, 2], DType::F32),
                    0,
                    empty(&[0, 2], DType::I64),
                    empty(&[0, 2], DType::F32),
                ),
                (
                    "index out of range",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    i64s(&[3], &[1, 1]),
                    randn(&[1, 1], 2, DType::F32),
                ),
                (
                    "index negative",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    i64s(&[-1], &[1, 1]),
                    randn(&[1, 1], 2, DType::F32),
                ),
                (
                    "index i64::MIN",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    i64s(&[i64::MIN], &[1, 1]),
                    randn(&[1, 1], 2, DType::F32),
                ),
                (
                    "index float",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    Tensor::from_vec(vec![0.0f32], [1, 1]),
                    randn(&[1, 1], 2, DType::F32),
                ),
                (
                    "index i32",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    Tensor::from_vec(vec![1i32], [1, 1]),
                    randn(&[1, 1], 2, DType::F32),
                ),
                (
                    "index larger than src",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    i64s(&[0; 6], &[3, 2]),
                    randn(&[1, 1], 2, DType::F32),
                ),
                (
                    "index larger than self",
                    randn(&[3, 2], 1, DType::F32),
                    1,
                    i64s(&[0; 9], &[3, 3]),
                    randn(&[3, 3], 2, DType::F32),
                ),
                (
                    "rank mismatch",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    i64s(&[0], &[1]),
                    randn(&[1], 2, DType::F32),
                ),
                (
                    "dim out of range",
                    randn(&[3, 2], 1, DType::F32),
                    2,
                    i64s(&[0], &[1, 1]),
                    randn(&[1, 1], 2, DType::F32),
                ),
                (
                    "dim far",
                    randn(&[3, 2], 1, DType::F32),
                    isize::MIN,
                    i64s(&[0], &[1, 1]),
                    randn(&[1, 1], 2, DType::F32),
                ),
                (
                    "dtype mismatch",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    i64s(&[0], &[1, 1]),
                    randn(&[1, 1], 2, DType::F64),
                ),
                (
                    "0-d",
                    Tensor::from_vec(vec![1.0f32], ()),
                    0,
                    Tensor::from_vec(vec![0i64], ()),
                    Tensor::from_vec(vec![2.0f32], ()),
                ),
                (
                    "nan src",
                    randn(&[3], 1, DType::F32),
                    0,
                    i64s(&[1, 1], &[2]),
                    Tensor::from_vec(vec![f32::NAN, 1.0], [2]),
                ),
                (
                    "f16",
                    randn(&[3], 1, DType::F16),
                    0,
                    i64s(&[1, 1], &[2]),
                    randn(&[2], 2, DType::F16),
                ),
                (
                    "bf16",
                    randn(&[3], 1, DType::BF16),
                    0,
                    i64s(&[1, 1], &[2]),
                    randn(&[2], 2, DType::BF16),
                ),
                (
                    "i64",
                    i64s(&[5, 6, 7], &[3]),
                    0,
                    i64s(&[1, 1], &[2]),
                    i64s(&[-3, 4], &[2]),
                ),
                (
                    "bool",
                    Tensor::from_vec(vec![true, false], [2]),
                    0,
                    i64s(&[1], &[1]),
                    Tensor::from_vec(vec![true], [1]),
                ),
                (
                    "transposed self",
                    randn(&[2, 3], 1, DType::F32).try_transpose(0, 1).unwrap(),
                    0,
                    i64s(&[0, 2, 0, 0], &[2, 2]),
                    randn(&[2, 2], 2, DType::F32),
                ),
                (
                    "expanded index",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    i64s(&[1, 0], &[1, 2]).try_broadcast_to([2, 2]).unwrap(),
                    randn(&[2, 2], 2, DType::F32),
                ),
                (
                    "flipped src",
                    randn(&[3, 2], 1, DType::F32),
                    0,
                    i64s(&[0, 2, 0, 0], &[2, 2]),
                    randn(&[2, 2], 2, DType::F32).try_flip([0, 1]).unwrap(),
                ),
            ] {
                let case = format!("scatter_reduce({label}, {reduce:?}, {include_self})");
                let (x2, i2, s2) = (x.clone(), index.clone(), src.clone());
                s.call(&case, "scatter_reduce", move || {
                    Ok(vec![x2.try_scatter_reduce(
                        dim,
                        &i2,
                        &s2,
                        reduce,
                        include_self,
                    )?])
                });
                let case = format!("scatter_reduce_({label}, {reduce:?}, {include_self})");
                let (x2, i2, s2) = (x.try_contiguous().unwrap(), index.clone(), src.clone());
                s.call(&case, "scatter_reduce", move || {
                    x2.try_scatter_reduce_(dim, &i2, &s2, reduce, include_self)?;
                    Ok(vec![x2])
                });
                // index_reduce with a 1-D index over `dim`.
                let flat = index.try_reshape([-1]).unwrap();
                let case = format!("index_reduce({label}, {reduce:?}, {include_self})");
                let (x2, i2, s2) = (x.clone(), flat.clone(), src.clone());
                s.call(&case, "index_reduce|scatter_reduce", move || {
                    Ok(vec![x2.try_index_reduce(
                        dim,
                        &i2,
                        &s2,
                        reduce,
                        include_self,
                    )?])
                });
                let case = format!("index_reduce_({label}, {reduce:?}, {include_self})");
                let (x2, i2, s2) = (x.try_contiguous().unwrap(), flat, src);
                s.call(&case, "index_reduce|scatter_reduce", move || {
                    x2.try_index_reduce_(dim, &i2, &s2, reduce, include_self)?;
                    Ok(vec![x2])
                });
            }
        }
    }
    // Values PyTorch documents: include_self=false with one source per place; NaN wins.
    let r = s.ok("scatter_reduce amax nan", "scatter_reduce", move || {
        let x = Tensor::from_vec(vec![0.0f32, 0.0], [2]);
        let i = Tensor::from_vec(vec![0i64, 0, 1], [3]);
        let src = Tensor::from_vec(vec![1.0f32, f32::NAN, -2.0], [3]);
        Ok(vec![x.try_scatter_reduce(0, &i, &src, "amax", false)?])
    });
    s.expect_values(
        "scatter_reduce amax nan",
        r.as_ref().map(|o| &o[0]),
        &[f64::NAN, -2.0],
        0.0,
    );
    let r = s.ok("index_reduce mean", "index_reduce", move || {
        let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3, 1]);
        let i = Tensor::from_vec(vec![0i64, 0, 2], [3]);
        let src = Tensor::from_vec(vec![4.0f32, 6.0, 9.0], [3, 1]);
        Ok(vec![x.try_index_reduce(0, &i, &src, "mean", true)?])
    });
    s.expect_values(
        "index_reduce mean",
        r.as_ref().map(|o| &o[0]),
        &[11.0 / 3.0, 2.0, 6.0],
        1e-6,
    );
    // A view equals its contiguous copy.
    for reduce in ["sum", "prod", "mean", "amax", "amin"] {
        let x = randn(&[4, 3], 5, DType::F64).try_transpose(0, 1).unwrap();
        let idx = Tensor::from_vec(vec![0i64, 2, 3, 0, 1, 1], [3, 2])
            .try_flip([0])
            .unwrap();
        let src = randn(&[2, 9], 6, DType::F64)
            .try_slice(&[(0, 2, 1), (0, 9, 3)])
            .unwrap()
            .try_transpose(0, 1)
            .unwrap();
        let f = |x: Tensor, i: Tensor, s: Tensor| {
            move || Ok(vec![x.try_scatter_reduce(1, &i, &s, reduce, false)?])
        };
        let a = s.ok(
            "view",
            "scatter_reduce",
            f(x.clone(), idx.clone(), src.clone()),
        );
        let b = s.ok(
            "copy",
            "scatter_reduce",
            f(
                x.try_contiguous().unwrap(),
                idx.try_contiguous().unwrap(),
                src.try_contiguous().unwrap(),
            ),
        );
        s.same(&format!("scatter_reduce views {reduce}"), &a, &b, 1e-12);
    }
    s.finish();
}

// ---------------------------------------------------------------------------------------
// quantiles, sorts and scans
// ---------------------------------------------------------------------------------------

#[test]
fn quantiles_sorts_and_scans_survive_hostile_inputs() {
    use kiln::QuantileInterpolation as Q;
    let mut s = Sweep::new("quantile/sort/scan");
    let inputs = || -> Vec<(&'static str, Tensor)> {
        vec![
            ("empty", empty(&[0], DType::F32)),
            ("empty rows", empty(&[3, 0], DType::F32)),
            ("empty cols", empty(&[0, 3], DType::F32)),
            ("0-d", Tensor::from_vec(vec![1.5f32], ())),
            ("size 1", Tensor::from_vec(vec![1.5f32], [1, 1])),
            (
                "nan",
                Tensor::from_vec(vec![1.0f32, f32::NAN, -1.0, 2.0], [2, 2]),
            ),
            (
                "inf",
                Tensor::from_vec(
                    vec![f32::INFINITY, f32::INFINITY, f32::NEG_INFINITY, 0.0],
                    [2, 2],
                ),
            ),
            ("f16", randn(&[3, 4], 1, DType::F16)),
            ("bf16", randn(&[3, 4], 2, DType::BF16)),
            ("f64", randn(&[3, 4], 3, DType::F64)),
            (
                "i64",
                Tensor::from_vec(vec![3i64, -1, i64::MAX, i64::MIN], [2, 2]),
            ),
            ("u8", Tensor::from_vec(vec![3u8, 255, 0, 7], [2, 2])),
            (
                "bool",
                Tensor::from_vec(vec![true, false, true, true], [2, 2]),
            ),
            (
                "transposed",
                randn(&[4, 3], 4, DType::F32).try_transpose(0, 1).unwrap(),
            ),
            (
                "expanded",
                randn(&[1, 4], 5, DType::F32)
                    .try_broadcast_to([3, 4])
                    .unwrap(),
            ),
        ]
    };
    for (label, x) in inputs() {
        for dim in [0isize, -1, 2, isize::MIN] {
            for q in [0.0, 0.5, 1.0, -0.1, 1.1, f64::NAN] {
                for interp in [Q::Linear, Q::Nearest] {
                    let xc = x.clone();
                    let case = format!("quantile({label}, {q}, {dim}, {interp:?})");
                    s.call(&case, "quantile", move || {
                        Ok(vec![xc.try_quantile(q, Some(dim), false, interp)?])
                    });
                }
                let xc = x.clone();
                let case = format!("nanquantile({label}, {q}, {dim})");
                s.call(&case, "nanquantile", move || {
                    Ok(vec![xc.try_nanquantile(q, Some(dim), true, Q::Midpoint)?])
                });
            }
            let xc = x.clone();
            s.call(
                &format!("quantiles({label}, {dim})"),
                "quantile",
                move || {
                    Ok(vec![xc.try_quantiles(
                        &[0.25, 0.75],
                        Some(dim),
                        false,
                        Q::Linear,
                    )?])
                },
            );
            let xc = x.clone();
            s.call(
                &format!("quantiles(none, {label}, {dim})"),
                "quantile",
                move || Ok(vec![xc.try_quantiles(&[], Some(dim), false, Q::Linear)?]),
            );
            for descending in [false, true] {
                let xc = x.clone();
                s.call(
                    &format!("sort({label}, {dim}, {descending})"),
                    "sort",
                    move || {
                        let (v, i) = xc.try_sort(dim, descending)?;
                        Ok(vec![v, i])
                    },
                );
            }
            for k in [0usize, 1, 2, 5, usize::MAX] {
                let xc = x.clone();
                s.call(&format!("topk({label}, {k}, {dim})"), "topk", move || {
                    let (v, i) = xc.try_topk(k, dim, true)?;
                    Ok(vec![v, i])
                });
                let xc = x.clone();
                s.call(
                    &format!("kthvalue({label}, {k}, {dim})"),
                    "kthvalue",
                    move || {
                        let (v, i) = xc.try_kthvalue(k, dim, false)?;
                        Ok(vec![v, i])
                    },
                );
            }
            let xc = x.clone();
            s.call(
                &format!("median_dim({label}, {dim})"),
                "median",
                move || {
                    let (v, i) = xc.try_median_dim(dim, true)?;
                    Ok(vec![v, i])
                },
            );
            let xc = x.clone();
            s.call(
                &format!("nanmedian_dim({label}, {dim})"),
                "nanmedian",
                move || {
                    let (v, i) = xc.try_nanmedian_dim(dim, false)?;
                    Ok(vec![v, i])
                },
            );
            let xc = x.clone();
            s.call(&format!("mode({label}, {dim})"), "mode", move || {
                let (v, i) = xc.try_mode(dim, false)?;
                Ok(vec![v, i])
            });
            let xc = x.clone();
            s.call(&format!("cumsum({label}, {dim})"), "cumsum", move || {
                Ok(vec![xc.try_cumsum(dim)?])
            });
            let xc = x.clone();
            s.call(&format!("cumprod({label}, {dim})"), "cumprod", move || {
                Ok(vec![xc.try_cumprod(dim)?])
            });
            let xc = x.clone();
            s.call(&format!("cummax({label}, {dim})"), "cummax", move || {
                let (v, i) = xc.try_cummax(dim)?;
                Ok(vec![v, i])
            });
            let xc = x.clone();
            s.call(&format!("cummin({label}, {dim})"), "cummin", move || {
                let (v, i) = xc.try_cummin(dim)?;
                Ok(vec![v, i])
            });
            let xc = x.clone();
            s.call(
                &format!("logcumsumexp({label}, {dim})"),
                "logcumsumexp",
                move || Ok(vec![xc.try_logcumsumexp(dim)?]),
            );
        }
        let xc = x.clone();
        s.call(&format!("quantile({label}, None)"), "quantile", move || {
            Ok(vec![xc.try_quantile(0.3, None, false, Q::Lower)?])
        });
        let xc = x.clone();
        s.call(&format!("median({label})"), "median", move || {
            Ok(vec![xc.try_median()?])
        });
        let xc = x.clone();
        s.call(&format!("nanmedian({label})"), "nanmedian", move || {
            Ok(vec![xc.try_nanmedian()?])
        });
        let xc = x.clone();
        s.call(
            &format!("searchsorted({label})"),
            "searchsorted",
            move || {
                Ok(vec![xc.try_searchsorted(
                    &Tensor::from_vec(vec![0.5f32], [1]).try_cast(xc.dtype())?,
                    false,
                )?])
            },
        );
        let xc = x.clone();
        s.call(&format!("bucketize({label})"), "bucketize", move || {
            Ok(vec![xc.try_bucketize(
                &Tensor::from_vec(vec![0.0f32, 1.0], [2]).try_cast(xc.dtype())?,
                true,
            )?])
        });
    }
    // Values: the sort of an empty lane is empty; NaN sorts last; cumsum of nothing.
    let r = s.ok("sort(nan)", "sort", || {
        let (v, i) = Tensor::from_vec(vec![f32::NAN, 1.0, -1.0], [3]).try_sort(0, false)?;
        Ok(vec![v, i])
    });
    s.expect_values(
        "sort(nan)",
        r.as_ref().map(|o| &o[0]),
        &[-1.0, 1.0, f64::NAN],
        0.0,
    );
    s.expect_values(
        "sort(nan) indices",
        r.as_ref().map(|o| &o[1]),
        &[2.0, 1.0, 0.0],
        0.0,
    );
    let r = s.ok("cumsum(3x0)", "cumsum", || {
        Ok(vec![empty(&[3, 0], DType::F32).try_cumsum(1)?])
    });
    s.expect_shapes("cumsum(3x0)", &r, &[&[3, 0]]);
    let r = s.ok("quantile(nan lane)", "quantile", || {
        let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 2.0, 3.0], [2, 2]);
        Ok(vec![x.try_quantile(0.5, Some(1), false, Q::Linear)?])
    });
    s.expect_values(
        "quantile(nan lane)",
        r.as_ref().map(|o| &o[0]),
        &[f64::NAN, 2.5],
        0.0,
    );
    let r = s.ok("cummax(nan)", "cummax", || {
        let (v, i) = Tensor::from_vec(vec![1.0f32, f32::NAN, 5.0], [3]).try_cummax(0)?;
        Ok(vec![v, i])
    });
    s.expect_values(
        "cummax(nan)",
        r.as_ref().map(|o| &o[0]),
        &[1.0, f64::NAN, f64::NAN],
        0.0,
    );
    s.expect_values(
        "cummax(nan) indices",
        r.as_ref().map(|o| &o[1]),
        &[0.0, 1.0, 1.0],
        0.0,
    );
    let r = s.ok("logcumsumexp(-inf)", "logcumsumexp", || {
        Ok(vec![
            Tensor::from_vec(vec![f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0], [3])
                .try_logcumsumexp(0)?,
        ])
    });
    s.expect_values(
        "logcumsumexp(-inf)",
        r.as_ref().map(|o| &o[0]),
        &[f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0],
        0.0,
    );
    let r = s.ok("topk(k=0)", "topk", || {
        let (v, i) = randn(&[2, 3], 1, DType::F32).try_topk(0, 1, true)?;
        Ok(vec![v, i])
    });
    s.expect_shapes("topk(k=0)", &r, &[&[2, 0], &[2, 0]]);
    // Views equal their contiguous copies.
    for (label, v) in views(&[2, 5, 4], 21, DType::F32) {
        let c = v.try_contiguous().unwrap();
        let f = |x: Tensor| {
            move || {
                let (sv, si) = x.try_sort(1, true)?;
                let (kv, ki) = x.try_topk(2, -1, false)?;
                let (mv, mi) = x.try_cummax(1)?;
                Ok(vec![
                    sv,
                    si,
                    kv,
                    ki,
                    mv,
                    mi,
                    x.try_cumsum(-1)?,
                    x.try_logcumsumexp(1)?,
                    x.try_quantile(0.3, Some(1), false, Q::Linear)?,
                    x.try_nanquantile(0.7, Some(-1), true, Q::Nearest)?,
                    x.try_median_dim(1, false)?.0,
                ])
            }
        };
        let a = s.ok(&format!("{label} view"), "sort", f(v));
        let b = s.ok(&format!("{label} copy"), "sort", f(c));
        s.same(label, &a, &b, 1e-5);
    }
    s.finish();
}

// ---------------------------------------------------------------------------------------
// einsum
// ---------------------------------------------------------------------------------------

#[test]
fn einsum_survives_hostile_equations() {
    let mut s = Sweep::new("einsum");
    let a = || randn(&[2, 3], 1, DType::F32);
    let b = || randn(&[3, 4], 2, DType::F32);
    let cases: Vec<(&str, Vec<Tensor>)> = vec![
        ("ij,jk->ik", vec![a(), b()]),
        ("", vec![]),
        ("", vec![a()]),
        ("->", vec![Tensor::from_vec(vec![2.0f32], ())]),
        ("ij->", vec![empty(&[0, 3], DType::F32)]),
        (
            "ij,jk->ik",
            vec![empty(&[2, 0], DType::F32), empty(&[0, 4], DType::F32)],
        ),
        ("ij,jk->ik", vec![a()]),
        ("ij,jk->ik", vec![a(), a()]),
        ("ij,jk->ik", vec![a(), b(), b()]),
        ("ij,jk->iz", vec![a(), b()]),
        ("ij,jk->ii", vec![a(), b()]),
        ("ij->j->i", vec![a()]),
        ("ij", vec![a(), b()]),
        ("i j->j i", vec![a()]),
        ("IJ->JI", vec![a()]),
        ("ij->ji", vec![a()]),
        ("é->", vec![f64s(&[1.0], &[1])]),
        ("0i->", vec![f64s(&[1.0], &[1])]),
        ("i->", vec![a()]),
        ("ijk->", vec![a()]),
        ("ii->i", vec![a()]),
        ("ii->i", vec![randn(&[3, 3], 3, DType::F64)]),
        ("iii->", vec![randn(&[2, 2, 2], 3, DType::F64)]),
        ("...->...", vec![Tensor::from_vec(vec![1.0f32], ())]),
        ("......->", vec![a()]),
        ("..i->", vec![a()]),
        (
            "...ij,...jk->...ik",
            vec![randn(&[5, 2, 3], 1, DType::F32), b()],
        ),
        (
            "...ij,...jk->...ik",
            vec![
                randn(&[5, 2, 3], 1, DType::F32),
                randn(&[4, 3, 4], 1, DType::F32),
            ],
        ),
        (
            "i,i->",
            vec![f64s(&[1.0, 2.0], &[2]), randn(&[2], 1, DType::F32)],
        ),
        (
            "i,i->",
            vec![
                Tensor::from_vec(vec![1i64, 2], [2]),
                Tensor::from_vec(vec![3i64, 4], [2]),
            ],
        ),
        (
            "i,i->",
            vec![randn(&[2], 1, DType::F16), randn(&[2], 2, DType::F16)],
        ),
        (
            "i,j->ij",
            vec![randn(&[1], 1, DType::F32), randn(&[3], 2, DType::F32)],
        ),
        (
            "i,i->i",
            vec![randn(&[1], 1, DType::F32), randn(&[3], 2, DType::F32)],
        ),
        (
            "ij,ij->",
            vec![
                a().try_transpose(0, 1).unwrap(),
                randn(&[3, 2], 1, DType::F32),
            ],
        ),
        ("i->", vec![Tensor::from_vec(vec![f32::NAN, 1.0], [2])]),
        (
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ->",
            vec![Tensor::try_zeros_dtype(vec![1usize; 52], DType::F32).unwrap()],
        ),
        (
            "ij,jk,kl->il",
            vec![a(), b(), randn(&[4, 0], 1, DType::F32)],
        ),
    ];
    for (eq, ops) in cases {
        let case = format!(
            "einsum({eq:?}, {:?})",
            ops.iter().map(|t| t.shape().to_vec()).collect::<Vec<_>>()
        );
        s.call(&case, "einsum", move || {
            let refs: Vec<&Tensor> = ops.iter().collect();
            Ok(vec![Tensor::try_einsum(eq, &refs)?])
        });
    }
    let r = s.ok("einsum empty contraction", "einsum", || {
        Ok(vec![Tensor::try_einsum(
            "ij,jk->ik",
            &[&empty(&[2, 0], DType::F32), &empty(&[0, 4], DType::F32)],
        )?])
    });
    s.expect_values(
        "einsum empty contraction",
        r.as_ref().map(|o| &o[0]),
        &[0.0; 8],
        0.0,
    );
    let r = s.ok("einsum diagonal", "einsum", || {
        Ok(vec![Tensor::try_einsum(
            "ii->i",
            &[&f64s(&[1.0, 2.0, 3.0, 4.0], &[2, 2])],
        )?])
    });
    s.expect_values(
        "einsum diagonal",
        r.as_ref().map(|o| &o[0]),
        &[1.0, 4.0],
        0.0,
    );
    for (label, v) in views(&[2, 3, 4], 31, DType::F64) {
        let c = v.try_contiguous().unwrap();
        let w = randn(&[4, 2], 32, DType::F64).try_flip([0]).unwrap();
        let f = |x: Tensor, w: Tensor| {
            move || {
                Ok(vec![
                    Tensor::try_einsum("bij,jk->bik", &[&x, &w])?,
                    Tensor::try_einsum("bij->jb", &[&x])?,
                ])
            }
        };
        let a = s.ok(&format!("{label} view"), "einsum", f(v, w.clone()));
        let b = s.ok(
            &format!("{label} copy"),
            "einsum",
            f(c, w.try_contiguous().unwrap()),
        );
        s.same(label, &a, &b, 1e-12);
    }
    s.finish();
}

// ---------------------------------------------------------------------------------------
// grid_sample, affine_grid, interpolate
// ---------------------------------------------------------------------------------------

#[test]
fn sampling_and_interpolation_survive_hostile_inputs() {
    use kiln::nn::functional::{
        GridSampleMode as M, GridSamplePadding as P, InterpolationMode as I, affine_grid,
        grid_sample, interpolate,
    };
    let mut s = Sweep::new("sampling");
    let grid = |n: usize, h: usize, w: usize, v: f32| {
        Tensor::try_full_on([n, h, w, 2], v, DType::F32, kiln::Device::Cpu).unwrap()
    };
    for mode in [M::Bilinear, M::Nearest, M::Bicubic] {
        for pad in [P::Zeros, P::Border, P::Reflection] {
            for align in [false, true] {
                for (label, x, g) in [
                    (
                        "ok",
                        randn(&[1, 2, 3, 4], 1, DType::F32),
                        randn(&[1, 2, 2, 2], 2, DType::F32),
                    ),
                    (
                        "nan grid",
                        randn(&[1, 1, 3, 3], 1, DType::F32),
                        grid(1, 1, 2, f32::NAN),
                    ),
                    (
                        "inf grid",
                        randn(&[1, 1, 3, 3], 1, DType::F32),
                        grid(1, 1, 2, f32::INFINITY),
                    ),
                    (
                        "-inf grid",
                        randn(&[1, 1, 3, 3], 1, DType::F32),
                        grid(1, 1, 2, f32::NEG_INFINITY),
                    ),
                    (
                        "huge grid",
                        randn(&[1, 1, 3, 3], 1, DType::F32),
                        grid(1, 1, 2, 3e38),
                    ),
                    (
                        "far grid",
                        randn(&[1, 1, 3, 3], 1, DType::F32),
                        grid(1, 1, 2, 1e9),
                    ),
                    (
                        "1x1 input",
                        randn(&[1, 1, 1, 1], 1, DType::F32),
                        randn(&[1, 2, 2, 2], 2, DType::F32),
                    ),
                    (
                        "empty input",
                        empty(&[1, 1, 0, 3], DType::F32),
                        randn(&[1, 2, 2, 2], 2, DType::F32),
                    ),
                    (
                        "empty batch",
                        empty(&[0, 1, 3, 3], DType::F32),
                        empty(&[0, 2, 2, 2], DType::F32),
                    ),
                    (
                        "no channels",
                        empty(&[1, 0, 3, 3], DType::F32),
                        randn(&[1, 2, 2, 2], 2, DType::F32),
                    ),
                    (
                        "empty grid",
                        randn(&[1, 1, 3, 3], 1, DType::F32),
                        empty(&[1, 0, 2, 2], DType::F32),
                    ),
                    (
                        "batch mismatch",
                        randn(&[2, 1, 3, 3], 1, DType::F32),
                        randn(&[1, 2, 2, 2], 2, DType::F32),
                    ),
                    (
                        "grid last 3",
                        randn(&[1, 1, 3, 3], 1, DType::F32),
                        randn(&[1, 2, 2, 3], 2, DType::F32),
                    ),
                    (
                        "3-d input",
                        randn(&[1, 3, 3], 1, DType::F32),
                        randn(&[1, 2, 2], 2, DType::F32),
                    ),
                    (
                        "dtype mismatch",
                        randn(&[1, 1, 3, 3], 1, DType::F64),
                        randn(&[1, 2, 2, 2], 2, DType::F32),
                    ),
                    (
                        "i64",
                        Tensor::from_vec(vec![1i64; 4], [1, 1, 2, 2]),
                        Tensor::from_vec(vec![0i64; 2], [1, 1, 1, 2]),
                    ),
                    (
                        "f16",
                        randn(&[1, 1, 3, 3], 1, DType::F16),
                        randn(&[1, 2, 2, 2], 2, DType::F16),
                    ),
                    (
                        "bf16",
                        randn(&[1, 1, 3, 3], 1, DType::BF16),
                        randn(&[1, 2, 2, 2], 2, DType::BF16),
                    ),
                    (
                        "f64",
                        randn(&[1, 1, 3, 3], 1, DType::F64),
                        randn(&[1, 2, 2, 2], 2, DType::F64),
                    ),
                    (
                        "5-d",
                        randn(&[1, 1, 2, 3, 3], 1, DType::F32),
                        randn(&[1, 2, 2, 2, 3], 2, DType::F32),
                    ),
                ] {
                    let case = format!("grid_sample({label}, {mode:?}, {pad:?}, {align})");
                    s.call(&case, "grid_sample", move || {
                        Ok(vec![grid_sample(&x, &g, mode, pad, align)?])
                    });
                }
            }
        }
    }
    // Grid views equal their contiguous copies.
    let g = randn(&[2, 3, 2, 2], 3, DType::F64)
        .try_permute([0, 2, 1, 3])
        .unwrap()
        .try_flip([3])
        .unwrap();
    let x = randn(&[2, 4, 3, 5], 4, DType::F64)
        .try_transpose(2, 3)
        .unwrap()
        .try_slice(&[(0, 2, 1), (0, 4, 2)])
        .unwrap();
    for mode in [M::Bilinear, M::Nearest, M::Bicubic] {
        let f = |x: Tensor, g: Tensor| {
            move || Ok(vec![grid_sample(&x, &g, mode, P::Reflection, false)?])
        };
        let a = s.ok("grid view", "grid_sample", f(x.clone(), g.clone()));
        let b = s.ok(
            "grid copy",
            "grid_sample",
            f(x.try_contiguous().unwrap(), g.try_contiguous().unwrap()),
        );
        s.same(&format!("grid_sample views {mode:?}"), &a, &b, 1e-12);
    }
    // affine_grid.
    for (label, theta, size) in [
        (
            "ok",
            randn(&[2, 2, 3], 1, DType::F32),
            vec![2usize, 1, 3, 4],
        ),
        (
            "empty batch",
            empty(&[0, 2, 3], DType::F32),
            vec![0, 1, 3, 4],
        ),
        (
            "zero size",
            randn(&[1, 2, 3], 1, DType::F32),
            vec![1, 1, 0, 4],
        ),
        ("1x1", randn(&[1, 2, 3], 1, DType::F32), vec![1, 1, 1, 1]),
        (
            "batch mismatch",
            randn(&[2, 2, 3], 1, DType::F32),
            vec![3, 1, 3, 4],
        ),
        (
            "theta shape",
            randn(&[1, 3, 3], 1, DType::F32),
            vec![1, 1, 3, 4],
        ),
        ("3-d size", randn(&[1, 2, 3], 1, DType::F32), vec![1, 1, 3]),
        ("5-d", randn(&[1, 3, 4], 1, DType::F32), vec![1, 1, 2, 3, 4]),
        (
            "5-d theta 2-d",
            randn(&[1, 2, 3], 1, DType::F32),
            vec![1, 1, 2, 3, 4],
        ),
        (
            "i64",
            Tensor::from_vec(vec![1i64; 6], [1, 2, 3]),
            vec![1, 1, 3, 4],
        ),
        (
            "nan",
            Tensor::from_vec(vec![f32::NAN; 6], [1, 2, 3]),
            vec![1, 1, 2, 2],
        ),
        ("f16", randn(&[1, 2, 3], 1, DType::F16), vec![1, 1, 3, 4]),
        (
            "huge",
            randn(&[1, 2, 3], 1, DType::F32),
            vec![1, 1, 1 << 40, 1 << 40],
        ),
    ] {
        for align in [false, true] {
            let (t, sz) = (theta.clone(), size.clone());
            let case = format!("affine_grid({label}, {align})");
            s.call(&case, "affine_grid", move || {
                Ok(vec![affine_grid(&t, &sz, align)?])
            });
        }
    }
    // PyTorch: a size-1 dimension sits at 0, with or without align_corners (its
    // `linspace_from_neg_one` of one step is 0).
    let r = s.ok("affine_grid(identity 1x1)", "affine_grid", || {
        let id = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0], [1, 2, 3]);
        Ok(vec![
            affine_grid(&id, &[1, 1, 1, 1], false)?,
            affine_grid(&id, &[1, 1, 1, 1], true)?,
        ])
    });
    s.expect_values(
        "affine_grid(identity 1x1)",
        r.as_ref().map(|o| &o[0]),
        &[0.0, 0.0],
        0.0,
    );
    s.expect_values(
        "affine_grid(identity 1x1) aligned",
        r.as_ref().map(|o| &o[1]),
        &[0.0, 0.0],
        0.0,
    );
    // interpolate.
    for mode in [
        I::Nearest,
        I::NearestExact,
        I::Linear,
        I::Bilinear,
        I::Bicubic,
        I::Trilinear,
        I::Area,
    ] {
        for (label, x, size, scale, align) in [
            (
                "ok 3-d",
                randn(&[1, 2, 5], 1, DType::F32),
                Some(vec![7usize]),
                None,
                None,
            ),
            (
                "ok 4-d",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                Some(vec![7usize, 2]),
                None,
                None,
            ),
            (
                "ok 5-d",
                randn(&[1, 1, 2, 3, 2], 1, DType::F32),
                Some(vec![3usize, 2, 4]),
                None,
                None,
            ),
            (
                "align",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                Some(vec![7, 2]),
                None,
                Some(true),
            ),
            (
                "size 0",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                Some(vec![0, 2]),
                None,
                None,
            ),
            (
                "size huge",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                Some(vec![1 << 40, 1 << 40]),
                None,
                None,
            ),
            (
                "size count",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                Some(vec![2]),
                None,
                None,
            ),
            (
                "both",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                Some(vec![2, 2]),
                Some(vec![2.0, 2.0]),
                None,
            ),
            (
                "neither",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                None,
                None,
                None,
            ),
            (
                "scale 0",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                None,
                Some(vec![0.0, 1.0]),
                None,
            ),
            (
                "scale negative",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                None,
                Some(vec![-2.0, 1.0]),
                None,
            ),
            (
                "scale nan",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                None,
                Some(vec![f64::NAN, 1.0]),
                None,
            ),
            (
                "scale inf",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                None,
                Some(vec![f64::INFINITY, 1.0]),
                None,
            ),
            (
                "scale huge",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                None,
                Some(vec![1e300, 1.0]),
                None,
            ),
            (
                "scale tiny",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                None,
                Some(vec![1e-300, 1.0]),
                None,
            ),
            (
                "scale one",
                randn(&[1, 2, 5, 3], 1, DType::F32),
                None,
                Some(vec![0.5]),
                None,
            ),
            (
                "empty input",
                empty(&[1, 2, 0, 3], DType::F32),
                Some(vec![4, 4]),
                None,
                None,
            ),
            (
                "empty batch",
                empty(&[0, 2, 5, 3], DType::F32),
                Some(vec![4, 4]),
                None,
                None,
            ),
            (
                "2-d",
                randn(&[2, 5], 1, DType::F32),
                Some(vec![4]),
                None,
                None,
            ),
            (
                "6-d",
                randn(&[1, 1, 1, 1, 1, 1], 1, DType::F32),
                Some(vec![2, 2, 2, 2]),
                None,
                None,
            ),
            (
                "i64",
                Tensor::from_vec(vec![1i64, 2, 3], [1, 1, 3]),
                Some(vec![5]),
                None,
                None,
            ),
            (
                "f16",
                randn(&[1, 2, 5, 3], 1, DType::F16),
                Some(vec![7, 2]),
                None,
                None,
            ),
            (
                "bf16",
                randn(&[1, 2, 5, 3], 1, DType::BF16),
                Some(vec![7, 2]),
                None,
                None,
            ),
            (
                "f64",
                randn(&[1, 2, 5, 3], 1, DType::F64),
                Some(vec![7, 2]),
                None,
                None,
            ),
            (
                "nan",
                Tensor::from_vec(vec![f32::NAN, 1.0, 2.0], [1, 1, 3]),
                Some(vec![5]),
                None,
                None,
            ),
            (
                "1 to many",
                randn(&[1, 1, 1, 1], 1, DType::F32),
                Some(vec![3, 3]),
                None,
                Some(true),
            ),
        ] {
            let case = format!("interpolate({label}, {mode:?})");
            s.call(&case, "interpolate", move || {
                Ok(vec![interpolate(
                    &x,
                    size.as_deref(),
                    scale.as_deref(),
                    mode,
                    align,
                    false,
                )?])
            });
        }
    }
    // Views equal their contiguous copies.
    let x = randn(&[2, 5, 3, 4], 9, DType::F64)
        .try_permute([0, 3, 2, 1])
        .unwrap()
        .try_flip([2])
        .unwrap();
    for mode in [
        I::Nearest,
        I::NearestExact,
        I::Bilinear,
        I::Bicubic,
        I::Area,
    ] {
        let f = |x: Tensor| {
            move || {
                Ok(vec![interpolate(
                    &x,
                    Some(&[5, 3]),
                    None,
                    mode,
                    None,
                    false,
                )?])
            }
        };
        let a = s.ok("interp view", "interpolate", f(x.clone()));
        let b = s.ok("interp copy", "interpolate", f(x.try_contiguous().unwrap()));
        s.same(&format!("interpolate views {mode:?}"), &a, &b, 1e-12);
    }
    s.finish();
}

// ---------------------------------------------------------------------------------------
// CTC loss
// ---------------------------------------------------------------------------------------

#[test]
fn ctc_loss_survives_hostile_inputs() {
    use kiln::nn::CtcLoss;
    use kiln::nn::functional::{CtcLossOptions, Reduction, ctc_loss, ctc_loss_with};
    let mut s = Sweep::new("ctc_loss");
    let lp = |t: usize, n: usize, c: usize| {
        randn(&[t, n, c], 1, DType::F32)
            .try_log_softmax(-1)
            .unwrap()
    };
    let i64s = |v: &[i64], shape: &[usize]| Tensor::from_vec(v.to_vec(), shape);
    for reduction in [Reduction::None, Reduction::Sum, Reduction::Mean] {
        for zero_infinity in [false, true] {
            for blank in [0usize, 2, 3, usize::MAX] {
                let opts = CtcLossOptions {
                    blank,
                    reduction,
                    zero_infinity,
                };
                for (label, log_probs, targets, il, tl) in [
                    (
                        "ok",
                        lp(4, 2, 3),
                        i64s(&[1, 1, 2, 0], &[2, 2]),
                        vec![4i64, 3],
                        vec![2i64, 1],
                    ),
                    (
                        "zero-length targets",
                        lp(4, 2, 3),
                        empty(&[2, 0], DType::I64),
                        vec![4, 2],
                        vec![0, 0],
                    ),
                    (
                        "zero-length input",
                        lp(4, 2, 3),
                        i64s(&[1, 1], &[2, 1]),
                        vec![0, 0],
                        vec![1, 0],
                    ),
                    (
                        "too short",
                        lp(2, 1, 3),
                        i64s(&[1, 1, 1], &[1, 3]),
                        vec![2],
                        vec![3],
                    ),
                    (
                        "repeat needs blank",
                        lp(2, 1, 3),
                        i64s(&[1, 1], &[1, 2]),
                        vec![2],
                        vec![2],
                    ),
                    (
                        "concatenated",
                        lp(4, 2, 3),
                        i64s(&[1, 2, 1], &[3]),
                        vec![4, 4],
                        vec![2, 1],
                    ),
                    (
                        "concatenated short",
                        lp(4, 2, 3),
                        i64s(&[1], &[1]),
                        vec![4, 4],
                        vec![2, 1],
                    ),
                    (
                        "unbatched",
                        randn(&[4, 3], 1, DType::F64),
                        i64s(&[1, 2], &[2]),
                        vec![4],
                        vec![2],
                    ),
                    (
                        "unbatched 2-d targets",
                        randn(&[4, 3], 1, DType::F64),
                        i64s(&[1, 2], &[1, 2]),
                        vec![4],
                        vec![2],
                    ),
                    (
                        "empty batch",
                        empty(&[4, 0, 3], DType::F32),
                        empty(&[0, 2], DType::I64),
                        vec![],
                        vec![],
                    ),
                    (
                        "no steps",
                        empty(&[0, 1, 3], DType::F32),
                        empty(&[1, 0], DType::I64),
                        vec![0],
                        vec![0],
                    ),
                    (
                        "one class",
                        lp(3, 1, 1),
                        empty(&[1, 0], DType::I64),
                        vec![3],
                        vec![0],
                    ),
                    (
                        "label out of range",
                        lp(4, 1, 3),
                        i64s(&[3], &[1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "label negative",
                        lp(4, 1, 3),
                        i64s(&[-1], &[1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "label huge",
                        lp(4, 1, 3),
                        i64s(&[i64::MAX], &[1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "input length long",
                        lp(4, 1, 3),
                        i64s(&[1], &[1, 1]),
                        vec![5],
                        vec![1],
                    ),
                    (
                        "input length negative",
                        lp(4, 1, 3),
                        i64s(&[1], &[1, 1]),
                        vec![-1],
                        vec![1],
                    ),
                    (
                        "target length long",
                        lp(4, 1, 3),
                        i64s(&[1], &[1, 1]),
                        vec![4],
                        vec![2],
                    ),
                    (
                        "target length negative",
                        lp(4, 1, 3),
                        i64s(&[1], &[1, 1]),
                        vec![4],
                        vec![-1],
                    ),
                    (
                        "target length huge",
                        lp(4, 1, 3),
                        i64s(&[1], &[1, 1]),
                        vec![4],
                        vec![i64::MAX],
                    ),
                    (
                        "lengths count",
                        lp(4, 2, 3),
                        i64s(&[1, 1], &[2, 1]),
                        vec![4],
                        vec![1, 1],
                    ),
                    (
                        "nan",
                        Tensor::from_vec(vec![f32::NAN; 6], [2, 1, 3]),
                        i64s(&[1], &[1, 1]),
                        vec![2],
                        vec![1],
                    ),
                    (
                        "-inf",
                        Tensor::from_vec(vec![f32::NEG_INFINITY; 6], [2, 1, 3]),
                        i64s(&[1], &[1, 1]),
                        vec![2],
                        vec![1],
                    ),
                    (
                        "+inf",
                        Tensor::from_vec(vec![f32::INFINITY; 6], [2, 1, 3]),
                        i64s(&[1], &[1, 1]),
                        vec![2],
                        vec![1],
                    ),
                    (
                        "f16",
                        lp(4, 1, 3).try_cast(DType::F16).unwrap(),
                        i64s(&[1], &[1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "i64 log_probs",
                        i64s(&[0; 12], &[4, 1, 3]),
                        i64s(&[1], &[1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "float targets",
                        lp(4, 1, 3),
                        Tensor::from_vec(vec![1.0f32], [1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "0-d targets",
                        lp(4, 1, 3),
                        Tensor::from_vec(vec![1i64], ()),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "3-d targets",
                        lp(4, 1, 3),
                        i64s(&[1], &[1, 1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "1-d log_probs",
                        randn(&[3], 1, DType::F32),
                        i64s(&[1], &[1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "4-d log_probs",
                        randn(&[4, 1, 3, 1], 1, DType::F32),
                        i64s(&[1], &[1, 1]),
                        vec![4],
                        vec![1],
                    ),
                    (
                        "permuted",
                        randn(&[3, 1, 4], 1, DType::F32)
                            .try_permute([2, 1, 0])
                            .unwrap(),
                        i64s(&[1], &[1, 1]),
                        vec![4],
                        vec![1],
                    ),
                ] {
                    let case =
                        format!("ctc_loss({label}, blank {blank}, {reduction:?}, {zero_infinity})");
                    s.call(&case, "ctc_loss", move || {
                        Ok(vec![ctc_loss_with(&log_probs, &targets, &il, &tl, &opts)?])
                    });
                }
            }
        }
    }
    // Lengths as tensors of odd dtypes and shapes.
    for (label, il) in [
        ("i32", Tensor::from_vec(vec![4i32], [1])),
        ("f32", Tensor::from_vec(vec![4.0f32], [1])),
        ("0-d", Tensor::from_vec(vec![4i64], ())),
        ("2-d", Tensor::from_vec(vec![4i64], [1, 1])),
        ("bool", Tensor::from_vec(vec![true], [1])),
        ("u8", Tensor::from_vec(vec![4u8], [1])),
    ] {
        let case = format!("ctc_loss(input_lengths {label})");
        s.call(&case, "ctc_loss", move || {
            Ok(vec![ctc_loss(
                &lp(4, 1, 3),
                &i64s(&[1], &[1, 1]),
                &il,
                &[1],
            )?])
        });
    }
    // Zero-length targets: the loss is -Σ_t log p(blank).
    let r = s.ok("ctc_loss(empty target)", "ctc_loss", || {
        let lp = Tensor::from_vec(vec![0.5f64.ln(); 6], [3, 1, 2]);
        let opts = CtcLossOptions {
            reduction: Reduction::None,
            ..Default::default()
        };
        Ok(vec![ctc_loss_with(
            &lp,
            &empty(&[1, 0], DType::I64),
            &[3],
            &[0],
            &opts,
        )?])
    });
    s.expect_values(
        "ctc_loss(empty target)",
        r.as_ref().map(|o| &o[0]),
        &[-3.0 * 0.5f64.ln()],
        1e-12,
    );
    // Mean divides by max(target length, 1).
    let r = s.ok("ctc_loss(empty target, mean)", "ctc_loss", || {
        let lp = Tensor::from_vec(vec![0.5f64.ln(); 6], [3, 1, 2]);
        Ok(vec![ctc_loss(
            &lp,
            &empty(&[1, 0], DType::I64),
            &[3],
            &[0],
        )?])
    });
    s.expect_values(
        "ctc_loss(empty target, mean)",
        r.as_ref().map(|o| &o[0]),
        &[-3.0 * 0.5f64.ln()],
        1e-12,
    );
    // No alignment: inf, or 0 with zero_infinity.
    let r = s.ok("ctc_loss(impossible)", "ctc_loss", move || {
        let lp = Tensor::from_vec(vec![0.5f64.ln(); 4], [2, 1, 2]);
        let t = i64s(&[1, 1, 1], &[1, 3]);
        let z = CtcLossOptions {
            zero_infinity: true,
            reduction: Reduction::Sum,
            ..Default::default()
        };
        Ok(vec![
            ctc_loss(&lp, &t, &[2], &[3])?,
            ctc_loss_with(&lp, &t, &[2], &[3], &z)?,
        ])
    });
    s.expect_values(
        "ctc_loss(impossible)",
        r.as_ref().map(|o| &o[0]),
        &[f64::INFINITY],
        0.0,
    );
    s.expect_values(
        "ctc_loss(impossible) zero_infinity",
        r.as_ref().map(|o| &o[1]),
        &[0.0],
        0.0,
    );
    // The module and views.
    s.ok("CtcLoss::forward", "ctc_loss", move || {
        Ok(vec![CtcLoss::default().forward(
            &lp(4, 2, 3),
            &i64s(&[1, 2, 2, 0], &[2, 2]),
            &[4, 4],
            &[2, 1],
        )?])
    });
    let v = randn(&[3, 2, 4], 5, DType::F64)
        .try_permute([2, 1, 0])
        .unwrap()
        .try_log_softmax(-1)
        .unwrap()
        .try_flip([0])
        .unwrap();
    let t = i64s(&[9, 1, 9, 2, 9, 1, 9, 1], &[2, 4])
        .try_slice(&[(0, 2, 1), (1, 4, 2)])
        .unwrap();
    let (v2, t2) = (v.try_contiguous().unwrap(), t.try_contiguous().unwrap());
    let opts = CtcLossOptions {
        reduction: Reduction::None,
        ..Default::default()
    };
    let a = s.ok("ctc view", "ctc_loss", move || {
        Ok(vec![ctc_loss_with(&v, &t, &[4, 3], &[2, 2], &opts)?])
    });
    let b = s.ok("ctc copy", "ctc_loss", move || {
        Ok(vec![ctc_loss_with(&v2, &t2, &[4, 3], &[2, 2], &opts)?])
    });
    s.same("ctc views", &a, &b, 1e-12);
    s.finish();
}

// ---------------------------------------------------------------------------------------
// fractional max pooling
// ---------------------------------------------------------------------------------------

#[test]
fn fractional_max_pool_survives_hostile_inputs() {
    use kiln::nn::functional::{
        fractional_max_pool2d, fractional_max_pool2d_with_samples, fractional_max_pool3d,
        fractional_max_pool3d_with_samples,
    };
    use kiln::nn::{FractionalMaxPool2d, FractionalMaxPool3d, Module};
    let mut s = Sweep::new("fractional_max_pool");
    let x4 = || randn(&[2, 3, 7, 6], 1, DType::F32);
    for (label, x, k, size, ratio) in [
        ("ok", x4(), [2usize, 2], Some([3usize, 3]), None),
        ("ratio", x4(), [2, 2], None, Some([0.5, 0.5])),
        ("both", x4(), [2, 2], Some([3, 3]), Some([0.5, 0.5])),
        ("neither", x4(), [2, 2], None, None),
        ("ratio 0", x4(), [2, 2], None, Some([0.0, 0.5])),
        ("ratio 1", x4(), [2, 2], None, Some([1.0, 0.5])),
        ("ratio nan", x4(), [2, 2], None, Some([f64::NAN, 0.5])),
        ("ratio tiny", x4(), [2, 2], None, Some([1e-300, 0.5])),
        ("size 0", x4(), [2, 2], Some([0, 3]), None),
        ("size 1", x4(), [2, 2], Some([1, 1]), None),
        ("size = input", x4(), [1, 1], Some([7, 6]), None),
        ("size too large", x4(), [2, 2], Some([7, 6]), None),
        ("size huge", x4(), [1, 1], Some([usize::MAX, 3]), None),
        ("kernel 0", x4(), [0, 2], Some([3, 3]), None),
        ("kernel = input", x4(), [7, 6], Some([1, 1]), None),
        ("kernel huge", x4(), [usize::MAX, 2], Some([1, 3]), None),
        ("kernel huge 2", x4(), [usize::MAX, 2], Some([2, 3]), None),
        (
            "empty batch",
            empty(&[0, 3, 7, 6], DType::F32),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "empty channels",
            empty(&[2, 0, 7, 6], DType::F32),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "empty plane",
            empty(&[2, 3, 0, 6], DType::F32),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "unbatched",
            randn(&[3, 7, 6], 1, DType::F32),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "2-d",
            randn(&[7, 6], 1, DType::F32),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "5-d",
            randn(&[1, 2, 3, 7, 6], 1, DType::F32),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "i64",
            Tensor::from_vec(vec![1i64; 36], [1, 1, 6, 6]),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "f16",
            randn(&[1, 2, 7, 6], 1, DType::F16),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "bf16",
            randn(&[1, 2, 7, 6], 1, DType::BF16),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "f64",
            randn(&[1, 2, 7, 6], 1, DType::F64),
            [2, 2],
            Some([3, 3]),
            None,
        ),
        (
            "nan",
            Tensor::from_vec(vec![f32::NAN; 16], [1, 1, 4, 4]),
            [2, 2],
            Some([2, 2]),
            None,
        ),
        (
            "permuted",
            randn(&[2, 6, 7, 3], 1, DType::F32)
                .try_permute([0, 3, 2, 1])
                .unwrap(),
            [2, 2],
            Some([3, 3]),
            None,
        ),
    ] {
        let case = format!("fractional_max_pool2d({label})");
        s.call(&case, "fractional_max_pool2d", move || {
            Ok(vec![fractional_max_pool2d(
                &x,
                k,
                size.map(Into::into),
                ratio,
                7,
            )?])
        });
    }
    for (label, x, k, size) in [
        (
            "ok",
            randn(&[1, 2, 5, 6, 7], 1, DType::F32),
            [2usize, 2, 2],
            [3usize, 3, 3],
        ),
        (
            "strict",
            randn(&[1, 2, 5, 6, 7], 1, DType::F32),
            [2, 2, 2],
            [4, 3, 3],
        ),
        (
            "kernel huge",
            randn(&[1, 2, 5, 6, 7], 1, DType::F32),
            [usize::MAX, 2, 2],
            [1, 3, 3],
        ),
        (
            "size huge",
            randn(&[1, 2, 5, 6, 7], 1, DType::F32),
            [1, 1, 1],
            [usize::MAX - 1, 3, 3],
        ),
        (
            "unbatched",
            randn(&[2, 5, 6, 7], 1, DType::F64),
            [2, 2, 2],
            [3, 3, 3],
        ),
        (
            "4-d batched? no: 3-d",
            randn(&[5, 6, 7], 1, DType::F32),
            [2, 2, 2],
            [3, 3, 3],
        ),
    ] {
        let case = format!("fractional_max_pool3d({label})");
        s.call(&case, "fractional_max_pool3d", move || {
            Ok(vec![fractional_max_pool3d(
                &x,
                k,
                Some(size.into()),
                None,
                7,
            )?])
        });
    }
    // Given samples: out of [0, 1), NaN, wrong shapes and dtypes.
    for (label, u) in [
        (
            "ok",
            Tensor::try_full_on([2, 3, 2], 0.5, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "zero",
            Tensor::try_full_on([2, 3, 2], 0.0, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "one",
            Tensor::try_full_on([2, 3, 2], 1.0, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "negative",
            Tensor::try_full_on([2, 3, 2], -3.0, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "large",
            Tensor::try_full_on([2, 3, 2], 1e30, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "nan",
            Tensor::try_full_on([2, 3, 2], f32::NAN, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "inf",
            Tensor::try_full_on([2, 3, 2], f32::INFINITY, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "more rows",
            Tensor::try_full_on([5, 3, 2], 0.5, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "fewer rows",
            Tensor::try_full_on([1, 3, 2], 0.5, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "3 columns",
            Tensor::try_full_on([2, 3, 3], 0.5, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "f64",
            Tensor::try_full_on([2, 3, 2], 0.5, DType::F64, kiln::Device::Cpu).unwrap(),
        ),
        (
            "2-d",
            Tensor::try_full_on([2, 6], 0.5, DType::F32, kiln::Device::Cpu).unwrap(),
        ),
        (
            "expanded",
            Tensor::try_full_on([1, 1, 2], 0.25, DType::F32, kiln::Device::Cpu)
                .unwrap()
                .try_broadcast_to([2, 3, 2])
                .unwrap(),
        ),
    ] {
        let u3 = u.clone();
        let case = format!("fractional_max_pool2d_with_samples({label})");
        s.call(&case, "fractional_max_pool2d", move || {
            let (v, i) = fractional_max_pool2d_with_samples(&x4(), 2, Some(3.into()), None, &u)?;
            Ok(vec![v, i])
        });
        let case = format!("fractional_max_pool3d_with_samples({label})");
        s.call(&case, "fractional_max_pool3d", move || {
            let x = randn(&[2, 3, 5, 6, 7], 1, DType::F32);
            let (v, i) = fractional_max_pool3d_with_samples(&x, 2, Some(3.into()), None, &u3)?;
            Ok(vec![v, i])
        });
    }
    // Modules.
    s.call(
        "FractionalMaxPool2d::with_ratio(nan)",
        "FractionalMaxPool2d",
        || {
            let p = FractionalMaxPool2d::with_ratio(2, [f64::NAN, 0.5], 0)?;
            Ok(vec![p.forward(&randn(&[1, 1, 6, 6], 1, DType::F32))?])
        },
    );
    s.call(
        "FractionalMaxPool3d::new(0 kernel)",
        "fractional_max_pool3d",
        || {
            let p = FractionalMaxPool3d::new(0, 2, 0);
            Ok(vec![p.forward(&randn(&[1, 1, 6, 6, 6], 1, DType::F32))?])
        },
    );
    // An output of 0 is an empty result, as PyTorch.
    let r = s.ok(
        "fractional_max_pool2d(size 0)",
        "fractional_max_pool2d",
        move || {
            let (v, i) = kiln::nn::functional::fractional_max_pool2d_with_indices(
                &x4(),
                2,
                Some([0, 3].into()),
                None,
                1,
            )?;
            Ok(vec![v, i])
        },
    );
    s.expect_shapes(
        "fractional_max_pool2d(size 0)",
        &r,
        &[&[2, 3, 0, 3], &[2, 3, 0, 3]],
    );
    // A view pools as its contiguous copy.
    let u = randn(&[2, 3, 2], 4, DType::F64)
        .try_abs()
        .unwrap()
        .try_clamp_max(0.9)
        .unwrap();
    let v = randn(&[2, 6, 7, 3], 5, DType::F64)
        .try_permute([0, 3, 2, 1])
        .unwrap()
        .try_flip([2])
        .unwrap();
    let c = v.try_contiguous().unwrap();
    let (u1, u2) = (u.clone(), u);
    let a = s.ok("pool view", "fractional_max_pool2d", move || {
        let (v, i) =
            fractional_max_pool2d_with_samples(&v, [2, 3], Some([4, 2].into()), None, &u1)?;
        Ok(vec![v, i])
    });
    let b = s.ok("pool copy", "fractional_max_pool2d", move || {
        let (v, i) =
            fractional_max_pool2d_with_samples(&c, [2, 3], Some([4, 2].into()), None, &u2)?;
        Ok(vec![v, i])
    });
    s.same("fractional_max_pool2d views", &a, &b, 0.0);
    s.finish();
}

// ---------------------------------------------------------------------------------------
// learning-rate schedules
// ---------------------------------------------------------------------------------------

#[test]
fn schedules_survive_hostile_arguments() {
    use kiln::optim::{
        BoxedSchedule, ChainedScheduler, ConstantLr, CosineAnnealingLr, CyclicLr, CyclicMode,
        ExponentialLr, LinearLr, LrScheduler, MultiStepLr, OneCycleLr, PolynomialLr, SequentialLr,
        Sgd, StepLr, WarmupCosine,
    };
    let mut s = Sweep::new("schedules");
    let steps = [
        0u64,
        1,
        2,
        5,
        1 << 31,
        (1 << 31) + 1,
        1 << 40,
        (1 << 40) + 1,
        u64::MAX - 1,
        u64::MAX,
    ];
    let schedules: Vec<(String, BoxedSchedule)> = {
        let mut v: Vec<(String, BoxedSchedule)> = Vec::new();
        for gamma in [0.5, 0.0, -1.0, 1.0, 1.5, f64::NAN, f64::INFINITY] {
            v.push((
                format!("StepLr(2, {gamma})"),
                Box::new(StepLr {
                    step_size: 2,
                    gamma,
                }),
            ));
            v.push((
                format!("StepLr(0, {gamma})"),
                Box::new(StepLr {
                    step_size: 0,
                    gamma,
                }),
            ));
            v.push((
                format!("ExponentialLr({gamma})"),
                Box::new(ExponentialLr { gamma }),
            ));
            v.push((
                format!("MultiStepLr({gamma})"),
                Box::new(MultiStepLr {
                    milestones: vec![0, 3, 3, u64::MAX],
                    gamma,
                }),
            ));
            v.push((
                format!("CyclicLr exp({gamma})"),
                Box::new(CyclicLr {
                    mode: CyclicMode::ExpRange { gamma },
                    ..CyclicLr::new(0.1, 1.0, 3)
                }),
            ));
        }
        for t_max in [0u64, 1, u64::MAX] {
            for eta_min in [0.0, -1.0, f64::NAN, 2.0] {
                v.push((
                    format!("CosineAnnealingLr({t_max}, {eta_min})"),
                    Box::new(CosineAnnealingLr { t_max, eta_min }),
                ));
            }
        }
        for (sf, ef, n) in [
            (0.5, 1.0, 4u64),
            (0.0, 1.0, 4),
            (1.5, 1.0, 4),
            (0.5, f64::NAN, 4),
            (0.5, 1.0, 0),
            (0.5, 1.0, u64::MAX),
        ] {
            v.push((
                format!("LinearLr({sf}, {ef}, {n})"),
                Box::new(LinearLr {
                    start_factor: sf,
                    end_factor: ef,
                    total_iters: n,
                }),
            ));
        }
        for (factor, n) in [
            (0.5, 3u64),
            (-0.5, 3),
            (f64::NAN, 3),
            (0.5, 0),
            (0.5, u64::MAX),
        ] {
            v.push((
                format!("ConstantLr({factor}, {n})"),
                Box::new(ConstantLr {
                    factor,
                    total_iters: n,
                }),
            ));
        }
        for (n, power) in [
            (4u64, 1.0),
            (0, 1.0),
            (4, 0.0),
            (4, -1.0),
            (4, f64::NAN),
            (u64::MAX, 2.0),
        ] {
            v.push((
                format!("PolynomialLr({n}, {power})"),
                Box::new(PolynomialLr {
                    total_iters: n,
                    power,
                }),
            ));
        }
        for (total, pct, three) in [
            (10u64, 0.3, false),
            (10, 0.3, true),
            (1, 0.3, false),
            (2, 0.5, false),
            (2, 0.5, true),
            (10, 0.1, true),
            (10, 0.0, false),
            (10, 1.0, false),
            (10, 1.0, true),
            (0, 0.3, false),
            (10, f64::NAN, false),
            (10, 1.5, false),
            (u64::MAX, 0.3, false),
        ] {
            v.push((
                format!("OneCycleLr({total}, {pct}, {three})"),
                Box::new(OneCycleLr {
                    pct_start: pct,
                    three_phase: three,
                    ..OneCycleLr::new(1.0, total)
                }),
            ));
        }
        for (up, down) in [
            (1u64, None),
            (0, None),
            (3, Some(0)),
            (u64::MAX, Some(u64::MAX)),
            (1, Some(u64::MAX)),
        ] {
            v.push((
                format!("CyclicLr({up}, {down:?})"),
                Box::new(CyclicLr {
                    step_size_down: down,
                    ..CyclicLr::new(0.1, 1.0, up)
                }),
            ));
        }
        v.push((
            "CyclicLr(nan base)".into(),
            Box::new(CyclicLr::new(f64::NAN, 1.0, 2)),
        ));
        for (warmup, total, min_ratio) in [
            (0u64, 10u64, 0.1),
            (10, 5, 0.1),
            (0, 0, 0.0),
            (5, 10, f64::NAN),
            (u64::MAX, u64::MAX, 0.1),
        ] {
            v.push((
                format!("WarmupCosine({warmup}, {total}, {min_ratio})"),
                Box::new(WarmupCosine {
                    base: 1.0,
                    warmup,
                    total,
                    min_ratio,
                }),
            ));
        }
        v.push((
            "WarmupCosine(nan base)".into(),
            Box::new(WarmupCosine {
                base: f64::NAN,
                warmup: 2,
                total: 5,
                min_ratio: 0.1,
            }),
        ));
        v.push((
            "SequentialLr(none)".into(),
            Box::new(SequentialLr::new(vec![], vec![])),
        ));
        v.push((
            "SequentialLr(count)".into(),
            Box::new(SequentialLr::new(
                vec![Box::new(ExponentialLr { gamma: 0.5 })],
                vec![3],
            )),
        ));
        v.push((
            "SequentialLr(decreasing)".into(),
            Box::new(SequentialLr::new(
                vec![
                    Box::new(ExponentialLr { gamma: 0.5 }),
                    Box::new(ExponentialLr { gamma: 0.5 }),
                    Box::new(ExponentialLr { gamma: 0.5 }),
                ],
                vec![5, 2],
            )),
        ));
        v.push((
            "SequentialLr(huge one-cycle)".into(),
            Box::new(SequentialLr::new(
                vec![
                    Box::new(ExponentialLr { gamma: 0.5 }),
                    Box::new(OneCycleLr::new(1.0, u64::MAX)),
                ],
                vec![5],
            )),
        ));
        v.push((
            "SequentialLr(milestone max)".into(),
            Box::new(SequentialLr::new(
                vec![
                    Box::new(ExponentialLr { gamma: 0.5 }),
                    Box::new(ConstantLr::default()),
                ],
                vec![u64::MAX],
            )),
        ));
        v.push((
            "ChainedScheduler(none)".into(),
            Box::new(ChainedScheduler::new(vec![])),
        ));
        v.push((
            "ChainedScheduler(two)".into(),
            Box::new(ChainedScheduler::new(vec![
                Box::new(ExponentialLr { gamma: 0.5 }),
                Box::new(OneCycleLr::new(1.0, 10)),
            ])),
        ));
        v
    };
    for (name, sched) in schedules {
        // Infinite arguments may give infinite rates, and 0·inf NaN, as in PyTorch.
        let finite = !name.contains("inf")
            && !name.contains("1.5")
            && !name.contains("18446744073709551615");
        let sched = std::sync::Arc::new(sched);
        // Either the schedule is refused with an error naming it, or every rate it gives
        // is a number (never NaN) at every step up to its last.
        let sc = sched.clone();
        let op: &'static str = Box::leak(
            name.split(['(', ' '])
                .next()
                .unwrap()
                .to_string()
                .into_boxed_str(),
        );
        let checked = s.run(&format!("{name}.check"), move || {
            sc.check().map_err(|e| e.to_string())
        });
        match checked {
            Some(Err(e)) => {
                if !e.contains(op) {
                    s.fail(&name, format!("error does not name {op}: {e}"));
                }
                continue;
            }
            None => continue,
            Some(Ok(())) => {}
        }
        for base in [0.1, 0.0] {
            for step in steps {
                let sc = sched.clone();
                let case = format!("{name}.lr_at({base}, {step})");
                let got = s.run(&case, move || {
                    if sc.last_step().is_some_and(|l| step > l) {
                        return None;
                    }
                    Some((sc.lr_at(base, step), sc.momentum_at(step)))
                });
                if let Some(Some((lr, m))) = got
                    && finite
                    && (lr.is_nan() || m.is_some_and(f64::is_nan))
                {
                    s.fail(&case, format!("NaN rate or momentum: {lr} {m:?}"));
                }
            }
        }
    }
    // Driving a scheduler: stepping past the end is an error naming it, never a panic.
    let p = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
    let r = s.run(
        "LrScheduler over OneCycleLr(1)",
        move || -> Result<Vec<f64>, String> {
            let mut opt = Sgd::new(vec![p], 0.1).map_err(|e| e.to_string())?;
            let mut sched =
                LrScheduler::new(&mut opt, OneCycleLr::new(1.0, 1)).map_err(|e| e.to_string())?;
            let mut lrs = vec![sched.last_lr()[0]];
            for _ in 0..3 {
                match sched.step(&mut opt) {
                    Ok(()) => lrs.push(sched.last_lr()[0]),
                    Err(e) => {
                        return if e.to_string().contains("LrScheduler::step") {
                            Ok(lrs)
                        } else {
                            Err(e.to_string())
                        };
                    }
                }
            }
            Err(format!("stepped past the end: {lrs:?}"))
        },
    );
    if let Some(Err(e)) = r {
        s.fail("LrScheduler over OneCycleLr(1)", e);
    }
    s.finish();
}

// ---------------------------------------------------------------------------------------
// Regressions: inputs that crashed kiln or gave a wrong value.
// ---------------------------------------------------------------------------------------

#[test]
fn affine_grid_of_an_absurd_size_is_an_error_not_an_abort() {
    // Used to build the base grid on the host: a [1, 1, 2^40, 2^40] size asked the
    // allocator for 8 TiB and aborted the process. The base grid is now lazy.
    use kiln::nn::functional::affine_grid;
    let theta = randn(&[1, 2, 3], 1, DType::F32);
    let e = affine_grid(&theta, &[1, 1, 1 << 40, 1 << 40], false).unwrap_err();
    assert!(matches!(e, KilnError::TooLarge { .. }), "{e}");
    // A large but recordable size records without computing anything.
    let g = affine_grid(&theta, &[1, 1, 1 << 20, 1 << 20], true).unwrap();
    assert_eq!(g.shape(), &[1, 1 << 20, 1 << 20, 2]);
    // The values are PyTorch's: the identity maps the base grid to itself.
    let id = Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 0.0, 1.0, 0.0], [1, 2, 3]);
    let g = affine_grid(&id, &[1, 1, 2, 3], false)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let (xs, ys) = ([-2.0 / 3.0, 0.0, 2.0 / 3.0], [-0.5, 0.5]);
    let want: Vec<f64> = ys
        .iter()
        .flat_map(|&y| xs.iter().flat_map(move |&x| [x, y]))
        .collect();
    assert!(close(&g, &want, 1e-15), "{g:?}");
    let id3 = Tensor::from_vec(
        vec![
            1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0,
        ],
        [1, 3, 4],
    );
    let g = affine_grid(&id3, &[1, 1, 2, 1, 3], true)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(g.len(), 18);
    // (x, y, z) with x along W = 3 fastest, y along H = 1 at 0, z along D = 2.
    assert_eq!(&g[..6], &[-1.0, 0.0, -1.0, 0.0, 0.0, -1.0]);
    assert_eq!(&g[15..], &[1.0, 0.0, 1.0]);
}

#[test]
fn interpolate_to_an_absurd_size_is_an_error_not_an_abort() {
    // Used to build its per-position source tables on the host for the requested size:
    // 2^40 positions asked the allocator for 24 TiB and aborted the process; a scale of
    // 1e300 saturated the size to usize::MAX.
    use kiln::nn::functional::{InterpolationMode, interpolate};
    let x = randn(&[1, 2, 5, 3], 1, DType::F32);
    for mode in [
        InterpolationMode::Nearest,
        InterpolationMode::Bilinear,
        InterpolationMode::Bicubic,
    ] {
        let e = interpolate(&x, Some(&[1 << 40, 1 << 40]), None, mode, None, false).unwrap_err();
        assert!(
            matches!(
                e,
                KilnError::TooLarge {
                    op: "interpolate",
                    ..
                }
            ),
            "{e}"
        );
        let e = interpolate(&x, None, Some(&[1e300, 1.0]), mode, None, false).unwrap_err();
        assert!(
            matches!(
                e,
                KilnError::TooLarge {
                    op: "interpolate",
                    ..
                }
            ),
            "{e}"
        );
    }
    // Ordinary sizes are unchanged: nearest doubling repeats each element.
    let y = interpolate(
        &x,
        None,
        Some(&[2.0, 1.0]),
        InterpolationMode::Nearest,
        None,
        false,
    )
    .unwrap();
    assert_eq!(y.shape(), &[1, 2, 10, 3]);
    let (xv, yv) = (x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
    assert_eq!(&yv[..6], &[xv[0], xv[1], xv[2], xv[0], xv[1], xv[2]]);
}

#[test]
fn histograms_with_absurd_bin_counts_are_errors() {
    // `bins = usize::MAX` used to wrap `bins + 1` to 0 edges and panic indexing them;
    // histogramdd with [2^30, 2^30] bins read every edge back to the host and ran for
    // minutes.
    let x = randn(&[5], 1, DType::F32);
    for bins in [usize::MAX, usize::MAX / 2, 1 << 62] {
        let e = x.try_histc(bins, 0.0, 1.0).unwrap_err();
        assert!(
            matches!(e, KilnError::InvalidArgument { op: "histc", .. }),
            "{e}"
        );
        let e = x
            .try_histogram(bins, Some((0.0, 1.0)), None, false)
            .unwrap_err();
        assert!(
            matches!(
                e,
                KilnError::InvalidArgument {
                    op: "histogram",
                    ..
                }
            ),
            "{e}"
        );
    }
    let pts = randn(&[5, 2], 2, DType::F32);
    let e = pts
        .try_histogramdd(&[1 << 30, 1 << 30], None, None, false)
        .unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::InvalidArgument {
                op: "histogramdd",
                ..
            }
        ),
        "{e}"
    );
    let e = pts
        .try_histogramdd(&[1 << 40, 1 << 40], None, None, false)
        .unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::InvalidArgument {
                op: "histogramdd",
                ..
            }
        ),
        "{e}"
    );
    // Points without coordinates used to fail inside a reshape.
    let e = empty(&[4, 0], DType::F32)
        .try_histogramdd(&[2], None, None, false)
        .unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::InvalidArgument {
                op: "histogramdd",
                ..
            }
        ),
        "{e}"
    );
    // Many bins, recorded lazily, still count right where they are read.
    let (h, edges) = Tensor::from_vec(vec![0.0f32, 0.5, 1.0], [3])
        .try_histogram(1 << 16, Some((0.0, 1.0)), None, false)
        .unwrap();
    assert_eq!(edges.shape(), &[(1 << 16) + 1]);
    let h = h.to_vec::<f32>().unwrap();
    assert_eq!((h[0], h[1 << 15], h[(1 << 16) - 1]), (1.0, 1.0, 1.0));
    assert_eq!(h.iter().sum::<f32>(), 3.0);
}

#[test]
fn fractional_max_pool_with_a_wrapping_kernel_or_size_names_the_op() {
    // `output + kernel - 1 <= input` used to be checked with wrapping arithmetic: a kernel
    // or output size near usize::MAX wrapped, passed, and failed later inside `arange`.
    use kiln::nn::functional::{fractional_max_pool2d, fractional_max_pool3d};
    let x = randn(&[1, 1, 7, 6], 1, DType::F32);
    for (k, o) in [
        ([usize::MAX, 2], [1, 3]),
        ([usize::MAX, 2], [2, 3]),
        ([1, 1], [usize::MAX, 3]),
    ] {
        let e = fractional_max_pool2d(&x, k, Some(o.into()), None, 0).unwrap_err();
        assert!(
            matches!(
                e,
                KilnError::InvalidArgument {
                    op: "fractional_max_pool2d",
                    ..
                }
            ),
            "{e}"
        );
    }
    let x = randn(&[1, 1, 5, 6, 7], 1, DType::F32);
    let e =
        fractional_max_pool3d(&x, [usize::MAX, 2, 2], Some([1, 3, 3].into()), None, 0).unwrap_err();
    assert!(
        matches!(
            e,
            KilnError::InvalidArgument {
                op: "fractional_max_pool3d",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn embedding_bag_over_an_empty_table_is_a_typed_error() {
    // Used to reach the executor and fail with an internal "kernel is invalid" error (the
    // masked lookup read row 0 of a table without rows).
    use kiln::nn::functional::{EmbeddingBagMode, embedding_bag};
    let w = empty(&[0, 3], DType::F32);
    let ids = Tensor::from_vec(vec![0i64, 0], [2]);
    let offsets = Tensor::from_vec(vec![0i64], [1]);
    for mode in [
        EmbeddingBagMode::Sum,
        EmbeddingBagMode::Mean,
        EmbeddingBagMode::Max,
    ] {
        let e = embedding_bag(&ids, &w, Some(&offsets), mode, None, false, None).unwrap_err();
        assert!(
            matches!(
                e,
                KilnError::InvalidArgument {
                    op: "embedding_bag",
                    ..
                }
            ),
            "{e}"
        );
    }
    // No ids at all: empty bags of zeros, as PyTorch.
    let none = empty(&[0], DType::I64);
    let out = embedding_bag(
        &none,
        &w,
        Some(&offsets),
        EmbeddingBagMode::Sum,
        None,
        false,
        None,
    )
    .unwrap();
    assert_eq!(out.shape(), &[1, 3]);
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![0.0; 3]);
}

#[test]
fn schedules_at_huge_steps_and_degenerate_phases() {
    use kiln::optim::{
        BoxedSchedule, ExponentialLr, LrSchedule, OneCycleLr, PolynomialLr, SequentialLr, StepLr,
        WarmupCosine,
    };
    // Steps past i32::MAX used to clamp the exponent: a rate growing by 1e-9 a step
    // stopped at e^2.1, and γ = -1 had the wrong sign on even steps.
    let grow = ExponentialLr { gamma: 1.0 + 1e-9 };
    assert_eq!(grow.lr_at(1.0, 1 << 40), f64::INFINITY);
    let decay = ExponentialLr { gamma: 1.0 - 1e-9 };
    assert!(decay.lr_at(1.0, 1 << 40) < 1e-300);
    let flip = ExponentialLr { gamma: -1.0 };
    assert_eq!(flip.lr_at(1.0, 1 << 32), 1.0);
    assert_eq!(flip.lr_at(1.0, (1 << 32) + 1), -1.0);
    let step = StepLr {
        step_size: 1,
        gamma: 0.5,
    };
    assert_eq!(step.lr_at(1.0, 1 << 33), 0.0);
    // 2^52 steps of 2^20: 2^32 decays, past i32::MAX (the clamp gave e^-2.1).
    let slow = StepLr {
        step_size: 1 << 20,
        gamma: 1.0 - 1e-9,
    };
    let want = (-4.294967296f64).exp();
    assert!((slow.lr_at(1.0, 1 << 52) - want).abs() < 1e-6 * want);
    // A one-cycle phase without steps used to divide 0 by 0 (PyTorch divides by zero
    // there): pct_start · total_steps = 1 made step 0's rate NaN.
    let s = OneCycleLr {
        pct_start: 0.5,
        ..OneCycleLr::new(1.0, 2)
    };
    assert_eq!(s.lr_at(0.0, 0), 1.0);
    assert_eq!(s.momentum_at(0), Some(0.85));
    assert!((s.lr_at(0.0, 1) - 1.0 / 25.0 / 1e4).abs() < 1e-18);
    let s = OneCycleLr {
        pct_start: 0.1,
        three_phase: true,
        ..OneCycleLr::new(1.0, 10)
    };
    assert_eq!(s.lr_at(0.0, 0), 1.0);
    let s = OneCycleLr {
        pct_start: 1.0,
        ..OneCycleLr::new(1.0, 10)
    };
    assert_eq!(s.lr_at(0.0, 9), 1.0);
    assert!((s.lr_at(0.0, 10) - 1.0 / 25.0 / 1e4).abs() < 1e-18);
    // A negative polynomial power made the last rate 0^-1 = inf (0 · inf = NaN for a zero
    // base); refused. NaN in WarmupCosine's base or floor was accepted.
    assert!(
        PolynomialLr {
            total_iters: 4,
            power: -1.0
        }
        .check()
        .is_err()
    );
    assert!(
        PolynomialLr {
            total_iters: 4,
            power: 0.0
        }
        .check()
        .is_ok()
    );
    for w in [
        WarmupCosine {
            base: f64::NAN,
            warmup: 1,
            total: 4,
            min_ratio: 0.1,
        },
        WarmupCosine {
            base: 1.0,
            warmup: 1,
            total: 4,
            min_ratio: f64::NAN,
        },
    ] {
        let e = w.check().unwrap_err();
        assert!(e.to_string().starts_with("WarmupCosine"), "{e}");
    }
    // The last step of a SequentialLr ending in a huge one-cycle used to wrap around to a
    // small number, so stepping stopped early.
    let seq = SequentialLr::new(
        vec![
            Box::new(ExponentialLr { gamma: 0.5 }) as BoxedSchedule,
            Box::new(OneCycleLr::new(1.0, u64::MAX)),
        ],
        vec![5],
    );
    assert_eq!(seq.last_step(), Some(u64::MAX));
}

// ---------------------------------------------------------------------------------------
// Gradients on hostile inputs
// ---------------------------------------------------------------------------------------

type Graded = fn(&Tensor) -> kiln::Result<Vec<Tensor>>;

/// Runs `f` on a fresh leaf copy of `x` (f64, requiring grad), sums its float outputs
/// that track gradients and runs backward; returns the outputs then the gradient.
fn with_grad(f: Graded, x: Tensor) -> kiln::Result<Vec<Tensor>> {
    let leaf = x.try_contiguous()?.detach().requires_grad_(true);
    let outs = f(&leaf)?;
    let mut total: Option<Tensor> = None;
    for o in outs
        .iter()
        .filter(|o| o.requires_grad() && o.dtype().is_float())
    {
        let s = o.try_sum(..)?;
        total = Some(match total {
            Some(t) => t.try_add(&s)?,
            None => s,
        });
    }
    let mut outs = outs;
    if let Some(t) = total {
        t.backward()?;
        if let Some(g) = leaf.grad() {
            if g.shape() != leaf.shape() {
                return Err(KilnError::Internal(format!(
                    "gradient shape {:?} for an input of shape {:?}",
                    g.shape(),
                    leaf.shape()
                )));
            }
            outs.push(g);
        }
    }
    Ok(outs)
}

#[test]
fn gradients_survive_hostile_inputs() {
    use kiln::QuantileInterpolation as Q;
    use kiln::nn::functional::{
        CtcLossOptions, GridSampleMode, GridSamplePadding, InterpolationMode, Reduction,
        ctc_loss_with, fractional_max_pool2d_with_samples, grid_sample, interpolate,
    };
    let mut s = Sweep::new("gradients");
    let matrix_fns: Vec<(&str, &'static str, Graded)> = vec![
        ("det", "linalg", |a| Ok(vec![linalg::det(a)?])),
        ("slogdet", "linalg", |a| Ok(vec![linalg::slogdet(a)?.1])),
        ("inv", "linalg", |a| Ok(vec![linalg::inv(a)?])),
        ("cholesky", "linalg", |a| Ok(vec![linalg::cholesky(a)?])),
        ("pinv", "linalg", |a| {
            Ok(vec![linalg::pinv(a, None, None, false)?])
        }),
        ("matrix_exp", "linalg", |a| Ok(vec![linalg::matrix_exp(a)?])),
        ("matrix_power 3", "linalg", |a| {
            Ok(vec![linalg::matrix_power(a, 3)?])
        }),
        ("matrix_power -2", "linalg", |a| {
            Ok(vec![linalg::matrix_power(a, -2)?])
        }),
        ("qr", "linalg", |a| {
            let (q, r) = linalg::qr(a)?;
            Ok(vec![q, r])
        }),
        ("svd", "linalg", |a| {
            let (u, s, v) = linalg::svd(a)?;
            Ok(vec![u, s, v])
        }),
        ("svd_full", "linalg", |a| {
            let (u, s, v) = linalg::svd_full(a)?;
            Ok(vec![u, s, v])
        }),
        ("svdvals", "linalg", |a| Ok(vec![linalg::svdvals(a)?])),
        ("eigh", "linalg", |a| {
            let (l, v) = linalg::eigh(a)?;
            Ok(vec![l, v])
        }),
        ("lu", "linalg", |a| {
            let (_, l, u) = linalg::lu(a)?;
            Ok(vec![l, u])
        }),
        ("lu_factor_ex", "linalg", |a| {
            Ok(vec![linalg::lu_factor_ex(a)?.0])
        }),
        ("cond", "linalg", |a| Ok(vec![linalg::cond(a, None)?])),
        ("cond 1", "linalg", |a| {
            Ok(vec![linalg::cond(a, Some(NormOrd::P(1.0)))?])
        }),
        ("matrix_norm nuc", "linalg", |a| {
            Ok(vec![linalg::matrix_norm(a, NormOrd::Nuc, [-2, -1], false)?])
        }),
        ("vector_norm inf", "linalg", |a| {
            Ok(vec![linalg::vector_norm(a, f64::INFINITY, .., false)?])
        }),
        ("vector_norm 0.5", "linalg", |a| {
            Ok(vec![linalg::vector_norm(a, 0.5, .., false)?])
        }),
        ("solve", "linalg", |a| {
            let b = Tensor::try_ones_dtype([a.shape()[a.ndim() - 2], 1].as_slice(), DType::F64)?;
            Ok(vec![linalg::solve(a, &b)?])
        }),
        ("solve_triangular", "linalg", |a| {
            let b = Tensor::try_ones_dtype([a.shape()[a.ndim() - 2], 2].as_slice(), DType::F64)?;
            Ok(vec![linalg::solve_triangular(a, &b, false, true, false)?])
        }),
        ("lstsq", "linalg", |a| {
            let b = Tensor::try_ones_dtype([a.shape()[a.ndim() - 2], 2].as_slice(), DType::F64)?;
            Ok(vec![linalg::lstsq(a, &b, None, None)?.solution])
        }),
        ("einsum", "einsum", |a| {
            Ok(vec![Tensor::try_einsum(
                "...ij,...jk->...ik",
                &[a, &a.try_transpose(-1, -2)?],
            )?])
        }),
        ("sort", "sort", |a| Ok(vec![a.try_sort(-1, false)?.0])),
        ("topk", "topk", |a| {
            Ok(vec![
                a.try_topk(1.min(a.shape()[a.ndim() - 1]), -1, true)?.0,
            ])
        }),
        ("quantile", "quantile", |a| {
            Ok(vec![a.try_quantile(0.3, Some(-1), false, Q::Linear)?])
        }),
        ("nanquantile", "nanquantile", |a| {
            Ok(vec![a.try_nanquantile(
                0.7,
                Some(-1),
                false,
                Q::Midpoint,
            )?])
        }),
        ("median_dim", "median", |a| {
            Ok(vec![a.try_median_dim(-1, false)?.0])
        }),
        ("mode", "mode", |a| Ok(vec![a.try_mode(-1, false)?.0])),
        ("cumprod", "cumprod", |a| Ok(vec![a.try_cumprod(-1)?])),
        ("cummax", "cummax", |a| Ok(vec![a.try_cummax(-1)?.0])),
        ("logcumsumexp", "logcumsumexp", |a| {
            Ok(vec![a.try_logcumsumexp(-1)?])
        }),
        ("scatter_reduce prod", "scatter_reduce", |a| {
            let n = a.shape()[a.ndim() - 1];
            let idx = Tensor::try_zeros_dtype(a.shape(), DType::I64)?;
            let _ = n;
            Ok(vec![a.try_scatter_reduce(-1, &idx, a, "prod", false)?])
        }),
        ("scatter_reduce amax", "scatter_reduce", |a| {
            let idx = Tensor::try_zeros_dtype(a.shape(), DType::I64)?;
            Ok(vec![a.try_scatter_reduce(-1, &idx, a, "amax", true)?])
        }),
        ("scatter_reduce mean", "scatter_reduce", |a| {
            let idx = Tensor::try_zeros_dtype(a.shape(), DType::I64)?;
            Ok(vec![a.try_scatter_reduce(-1, &idx, a, "mean", false)?])
        }),
    ];
    let spd = f64s(&[4.0, 1.0, 1.0, 3.0], &[2, 2]);
    let inputs = || -> Vec<(&'static str, Tensor)> {
        vec![
            ("0x0", empty(&[0, 0], DType::F64)),
            ("2x0x0", empty(&[2, 0, 0], DType::F64)),
            ("0x3x3", empty(&[0, 3, 3], DType::F64)),
            ("0x3", empty(&[0, 3], DType::F64)),
            ("3x0", empty(&[3, 0], DType::F64)),
            ("1x1", f64s(&[2.0], &[1, 1])),
            ("identity", Tensor::try_eye(3, DType::F64).unwrap()),
            ("zeros", empty(&[2, 2], DType::F64)),
            ("ties", f64s(&[1.0, 1.0, 1.0, 1.0], &[2, 2])),
            ("nan", f64s(&[f64::NAN, 1.0, 2.0, 3.0], &[2, 2])),
            ("inf", f64s(&[f64::INFINITY, 1.0, 2.0, 3.0], &[2, 2])),
            ("with zero", f64s(&[0.0, 2.0, 3.0, 0.0], &[2, 2])),
            ("2x3", randn(&[2, 3], 1, DType::F64)),
            (
                "transposed",
                randn(&[3, 2], 2, DType::F64).try_transpose(0, 1).unwrap(),
            ),
        ]
    };
    for (name, op, f) in &matrix_fns {
        for (label, x) in inputs() {
            let f = *f;
            let case = format!("{name}({label}) backward");
            s.call(&case, op, move || with_grad(f, x));
        }
    }
    let r = s.ok("cholesky(spd) backward", "linalg", move || {
        with_grad(|a| Ok(vec![linalg::cholesky(a)?]), spd)
    });
    s.expect_shapes("cholesky(spd) backward", &r, &[&[2, 2], &[2, 2]]);
    // det of a 0x0 matrix is the constant 1: its gradient is an empty tensor.
    let r = s.ok("det(0x0) backward", "linalg", || {
        with_grad(|a| Ok(vec![linalg::det(a)?]), empty(&[0, 0], DType::F64))
    });
    s.expect_shapes("det(0x0) backward", &r, &[&[], &[0, 0]]);
    // ctc_loss: zero-length targets, impossible alignments, no input steps.
    for zero_infinity in [false, true] {
        for (label, targets, il, tl) in [
            (
                "empty targets",
                empty(&[2, 0], DType::I64),
                vec![3i64, 0],
                vec![0i64, 0],
            ),
            (
                "impossible",
                Tensor::from_vec(vec![1i64, 1, 1, 1, 1, 1], [2, 3]),
                vec![3, 2],
                vec![3, 3],
            ),
            (
                "no steps",
                Tensor::from_vec(vec![1i64, 2, 1, 2, 0, 0], [2, 3]),
                vec![0, 0],
                vec![2, 0],
            ),
        ] {
            let case = format!("ctc_loss({label}, {zero_infinity}) backward");
            let x = randn(&[3, 2, 3], 3, DType::F64)
                .try_log_softmax(-1)
                .unwrap();
            s.call(&case, "ctc_loss", move || {
                let leaf = x.detach().requires_grad_(true);
                let opts = CtcLossOptions {
                    zero_infinity,
                    reduction: Reduction::Sum,
                    ..Default::default()
                };
                let l = ctc_loss_with(&leaf, &targets, &il, &tl, &opts)?;
                l.backward()?;
                let g = leaf
                    .grad()
                    .ok_or_else(|| KilnError::Internal("no gradient".into()))?;
                if zero_infinity || label != "impossible" {
                    let v = g.to_vec::<f64>()?;
                    if v.iter().any(|x| !x.is_finite()) {
                        return Err(KilnError::Internal(format!(
                            "non-finite ctc gradient {v:?}"
                        )));
                    }
                }
                Ok(vec![l, g])
            });
        }
    }
    // Pools and samplers.
    for (label, x) in [
        ("nan", Tensor::from_vec(vec![f64::NAN; 16], [1, 1, 4, 4])),
        ("ties", Tensor::from_vec(vec![1.0f64; 16], [1, 1, 4, 4])),
        ("random", randn(&[1, 2, 4, 4], 4, DType::F64)),
    ] {
        let c = x.shape()[1];
        let case = format!("fractional_max_pool2d({label}) backward");
        s.call(&case, "fractional_max_pool2d", move || {
            let leaf = x.detach().requires_grad_(true);
            let u = Tensor::try_full_on([1, c, 2], 0.3, DType::F64, kiln::Device::Cpu)?;
            let (v, _) = fractional_max_pool2d_with_samples(&leaf, 2, Some(2.into()), None, &u)?;
            v.try_sum(..)?.backward()?;
            let g = leaf
                .grad()
                .ok_or_else(|| KilnError::Internal("no gradient".into()))?;
            Ok(vec![v, g])
        });
    }
    for (label, g) in [
        (
            "nan grid",
            Tensor::try_full_on([1, 2, 2, 2], f64::NAN, DType::F64, kiln::Device::Cpu).unwrap(),
        ),
        (
            "border grid",
            Tensor::try_full_on([1, 2, 2, 2], 1.0, DType::F64, kiln::Device::Cpu).unwrap(),
        ),
        (
            "far grid",
            Tensor::try_full_on([1, 2, 2, 2], 1e6, DType::F64, kiln::Device::Cpu).unwrap(),
        ),
    ] {
        for mode in [
            GridSampleMode::Bilinear,
            GridSampleMode::Bicubic,
            GridSampleMode::Nearest,
        ] {
            for pad in [
                GridSamplePadding::Zeros,
                GridSamplePadding::Border,
                GridSamplePadding::Reflection,
            ] {
                let case = format!("grid_sample({label}, {mode:?}, {pad:?}) backward");
                let g = g.clone();
                s.call(&case, "grid_sample", move || {
                    let x = randn(&[1, 1, 3, 3], 5, DType::F64).requires_grad_(true);
                    let gl = g.detach().requires_grad_(true);
                    let y = grid_sample(&x, &gl, mode, pad, true)?;
                    y.try_sum(..)?.backward()?;
                    let gx = x
                        .grad()
                        .ok_or_else(|| KilnError::Internal("no input gradient".into()))?;
                    Ok(vec![y, gx])
                });
            }
        }
    }
    for mode in [
        InterpolationMode::Bilinear,
        InterpolationMode::Bicubic,
        InterpolationMode::Area,
        InterpolationMode::NearestExact,
    ] {
        let case = format!("interpolate({mode:?}) backward");
        s.call(&case, "interpolate", move || {
            let x = randn(&[1, 1, 1, 3], 6, DType::F64).requires_grad_(true);
            let y = interpolate(&x, Some(&[4, 2]), None, mode, None, false)?;
            y.try_sum(..)?.backward()?;
            let g = x
                .grad()
                .ok_or_else(|| KilnError::Internal("no gradient".into()))?;
            Ok(vec![y, g])
        });
    }
    s.finish();
}

#[test]
fn qr_and_cholesky_of_empty_matrices_differentiate() {
    // The QR backward setup cut R into `k·n`-sized chunks and cholesky's cut L into `n·n`
    // ones: for empty matrices that is `chunks(0)`, which panicked as soon as the input
    // required grad.
    for shape in [&[0usize, 0][..], &[2, 0, 0], &[0, 3], &[3, 0], &[0, 2, 2]] {
        let a = empty(shape, DType::F64).requires_grad_(true);
        let (q, r) = linalg::qr(&a).unwrap();
        q.try_sum(..)
            .unwrap()
            .try_add(r.try_sum(..).unwrap())
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(a.grad().unwrap().shape(), shape);
    }
    for shape in [&[0usize, 0][..], &[2, 0, 0]] {
        let a = empty(shape, DType::F64).requires_grad_(true);
        let l = linalg::cholesky(&a).unwrap();
        assert_eq!(l.shape(), shape);
        l.try_sum(..).unwrap().backward().unwrap();
        assert_eq!(a.grad().unwrap().shape(), shape);
    }
}

#[test]
fn embedding_bag_memory_is_linear_in_the_ids() {
    // The 1-D path laid the bags out as [bags, longest bag] on the host: 50 000 offsets
    // of one long bag beside 49 999 empty ones asked for 2.5·10⁹ entries (tens of GB).
    // It is now linear in the ids.
    use kiln::nn::functional::{EmbeddingBagMode, embedding_bag};
    let n = 50_000usize;
    let ids: Vec<i64> = (0..n as i64).map(|i| i % 7).collect();
    let w = f64s(&(0..14).map(|v| v as f64).collect::<Vec<_>>(), &[7, 2]);
    let offsets = Tensor::from_vec(vec![0i64; n], [n]);
    let ids_t = Tensor::from_vec(ids.clone(), [n]);
    for mode in [
        EmbeddingBagMode::Sum,
        EmbeddingBagMode::Mean,
        EmbeddingBagMode::Max,
    ] {
        let out = embedding_bag(&ids_t, &w, Some(&offsets), mode, None, false, None).unwrap();
        assert_eq!(out.shape(), &[n, 2]);
        let v = out
            .try_narrow(0, n as isize - 1, 1)
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        let sum: [f64; 2] = [0, 1].map(|f| ids.iter().map(|&i| (2 * i + f) as f64).sum());
        let want = match mode {
            EmbeddingBagMode::Sum => sum.to_vec(),
            EmbeddingBagMode::Mean => sum.iter().map(|s| s / n as f64).collect(),
            EmbeddingBagMode::Max => vec![12.0, 13.0],
        };
        assert!(close(&v, &want, 1e-12), "{mode:?}: {v:?}");
        let head = out
            .try_narrow(0, 0, n - 1)
            .unwrap()
            .try_abs()
            .unwrap()
            .try_sum(..)
            .unwrap();
        assert_eq!(head.item::<f64>().unwrap(), 0.0);
    }
    // Max keeps the first largest row of a bag, as the 2-D path (and PyTorch's kernel)
    // does: values and the gradient, which reaches that one row.
    let w = f64s(&[1.0, 5.0, 1.0, 5.0, f64::NAN, 0.0], &[3, 2]);
    let one_d = |w: &Tensor| {
        let ids = Tensor::from_vec(vec![1i64, 0, 2, 0, 2, 1], [6]);
        let off = Tensor::from_vec(vec![0i64, 3], [2]);
        embedding_bag(
            &ids,
            w,
            Some(&off),
            EmbeddingBagMode::Max,
            None,
            false,
            None,
        )
        .unwrap()
    };
    let two_d = |w: &Tensor| {
        let ids = Tensor::from_vec(vec![1i64, 0, 2, 0, 2, 1], [2, 3]);
        embedding_bag(&ids, w, None, EmbeddingBagMode::Max, None, false, None).unwrap()
    };
    let (a, b) = (
        w.detach().requires_grad_(true),
        w.detach().requires_grad_(true),
    );
    let (ya, yb) = (one_d(&a), two_d(&b));
    let (va, vb) = (ya.to_vec::<f64>().unwrap(), yb.to_vec::<f64>().unwrap());
    assert!(close(&va, &[f64::NAN, 5.0, f64::NAN, 5.0], 0.0), "{va:?}");
    assert!(close(&va, &vb, 0.0), "{va:?} {vb:?}");
    ya.try_sum(..).unwrap().backward().unwrap();
    yb.try_sum(..).unwrap().backward().unwrap();
    let (ga, gb) = (
        a.grad().unwrap().to_vec::<f64>().unwrap(),
        b.grad().unwrap().to_vec::<f64>().unwrap(),
    );
    // Rows 0 and 1 tie in feature 1: each bag's first (row 1, then row 0) takes it.
    assert_eq!(ga, vec![0.0, 1.0, 0.0, 1.0, 2.0, 0.0]);
    assert_eq!(ga, gb);
}

#[test]
fn fold_unfold_and_pixel_shuffle_survive_hostile_arguments() {
    use kiln::nn::functional::{fold, pixel_shuffle, pixel_unshuffle, unfold};
    let mut s = Sweep::new("fold/unfold/pixel_shuffle");
    let big = [usize::MAX, usize::MAX / 2, 1 << 32, (1 << 32) + 1, 1 << 62];
    for (label, x) in [
        ("ok", randn(&[1, 2, 5, 4], 1, DType::F32)),
        ("empty batch", empty(&[0, 2, 5, 4], DType::F32)),
        ("no channels", empty(&[1, 0, 5, 4], DType::F32)),
        ("empty plane", empty(&[1, 2, 0, 4], DType::F32)),
        ("unbatched", randn(&[2, 5, 4], 1, DType::F64)),
        ("2-d", randn(&[5, 4], 1, DType::F32)),
        ("i64", Tensor::from_vec(vec![1i64; 20], [1, 1, 5, 4])),
        ("f16", randn(&[1, 2, 5, 4], 1, DType::F16)),
        (
            "permuted",
            randn(&[1, 4, 5, 2], 1, DType::F32)
                .try_permute([0, 3, 2, 1])
                .unwrap(),
        ),
    ] {
        for (k, d, p, st) in [
            (2usize, 1usize, 0usize, 1usize),
            (0, 1, 0, 1),
            (2, 0, 0, 1),
            (2, 1, 0, 0),
            (9, 1, 0, 1),
            (2, 1, 3, 2),
        ]
        .into_iter()
        .chain(
            big.iter()
                .flat_map(|&b| [(b, 1, 0, 1), (2, b, 0, 1), (2, 1, b, 1), (2, 1, 0, b)]),
        ) {
            let xc = x.clone();
            let case = format!("unfold({label}, k {k}, d {d}, p {p}, s {st})");
            s.call(&case, "unfold", move || Ok(vec![unfold(&xc, k, d, p, st)?]));
            let xc = x.clone();
            let case = format!("fold(unfold({label}), k {k}, d {d}, p {p}, s {st})");
            s.call(&case, "fold|unfold", move || {
                let cols = unfold(&xc, k, d, p, st)?;
                let hw = [xc.shape()[xc.ndim() - 2], xc.shape()[xc.ndim() - 1]];
                Ok(vec![fold(&cols, hw, k, d, p, st)?])
            });
        }
        for r in [0usize, 1, 2, 3].into_iter().chain(big) {
            let xc = x.clone();
            let case = format!("pixel_shuffle({label}, {r})");
            s.call(&case, "pixel_shuffle", move || {
                Ok(vec![pixel_shuffle(&xc, r)?])
            });
            let xc = x.clone();
            let case = format!("pixel_unshuffle({label}, {r})");
            s.call(&case, "pixel_unshuffle", move || {
                Ok(vec![pixel_unshuffle(&xc, r)?])
            });
        }
    }
    for (label, cols, out) in [
        ("wrong L", randn(&[1, 8, 5], 1, DType::F32), [3usize, 3]),
        ("wrong C·k", randn(&[1, 7, 4], 1, DType::F32), [3, 3]),
        ("zero output", randn(&[1, 8, 4], 1, DType::F32), [0, 3]),
        (
            "huge output",
            randn(&[1, 8, 4], 1, DType::F32),
            [usize::MAX, 3],
        ),
        ("empty cols", empty(&[1, 0, 4], DType::F32), [3, 3]),
    ] {
        let case = format!("fold({label})");
        s.call(&case, "fold", move || {
            Ok(vec![fold(&cols, out, 2, 1, 0, 1)?])
        });
    }
    // Shapes PyTorch gives for empty inputs.
    let r = s.ok("pixel_shuffle(no channels)", "pixel_shuffle", || {
        Ok(vec![pixel_shuffle(&empty(&[1, 0, 2, 3], DType::F32), 2)?])
    });
    s.expect_shapes("pixel_shuffle(no channels)", &r, &[&[1, 0, 4, 6]]);
    let r = s.ok("pixel_unshuffle(empty plane)", "pixel_unshuffle", || {
        Ok(vec![pixel_unshuffle(&empty(&[1, 1, 0, 4], DType::F32), 2)?])
    });
    s.expect_shapes("pixel_unshuffle(empty plane)", &r, &[&[1, 4, 0, 2]]);
    s.finish();
}

#[test]
fn huge_block_and_shuffle_arguments_are_errors_naming_the_op() {
    // pixel_shuffle with a factor of 2^32 wrapped r² to 0: with no channels it passed the
    // divisibility check and divided by zero (a panic); larger factors failed inside a
    // reshape. unfold/fold computed `len + 2·padding` and `dilation·(kernel - 1) + 1`
    // with wrapping arithmetic, so huge arguments failed inside pad, stack or slice.
    use kiln::nn::functional::{fold, pixel_shuffle, pixel_unshuffle, unfold};
    let none = empty(&[1, 0, 2, 3], DType::F32);
    let x = randn(&[1, 2, 5, 4], 1, DType::F32);
    for r in [1usize << 32, 1 << 62, usize::MAX] {
        for t in [&none, &x] {
            let e = pixel_shuffle(t, r).unwrap_err();
            assert!(
                matches!(
                    e,
                    KilnError::InvalidArgument {
                        op: "pixel_shuffle",
                        ..
                    }
                ),
                "{e}"
            );
        }
        let e = pixel_unshuffle(&empty(&[1, 1, 0, 0], DType::F32), r).unwrap_err();
        assert!(
            matches!(
                e,
                KilnError::InvalidArgument {
                    op: "pixel_unshuffle",
                    ..
                }
            ),
            "{e}"
        );
    }
    for (k, d, p, s) in [
        (2usize, usize::MAX, 0usize, 1usize),
        (2, 1, usize::MAX, 1),
        (2, 1, 0, usize::MAX),
        (usize::MAX, 1, 0, 1),
        (2, 1 << 62, 0, 1),
    ] {
        let e = unfold(&x, k, d, p, s).unwrap_err();
        assert!(
            matches!(e, KilnError::InvalidArgument { op: "unfold", .. }),
            "{e}"
        );
        let cols = randn(&[1, 8, 12], 2, DType::F32);
        let e = fold(&cols, [4, 5], k, d, p, s).unwrap_err();
        assert!(
            matches!(e, KilnError::InvalidArgument { op: "fold", .. }),
            "{e}"
        );
    }
    // The ordinary factors still shuffle.
    assert_eq!(pixel_shuffle(&none, 2).unwrap().shape(), &[1, 0, 4, 6]);
    assert_eq!(unfold(&x, 2, 1, 0, 1).unwrap().shape(), &[1, 8, 12]);
}

#[test]
fn bincount_of_a_huge_value_or_minlength_names_bincount() {
    // The counts tensor of length max(x) + 1 (or minlength) was refused inside the zeros
    // it would fill, by an error naming `full`.
    for (x, minlength) in [
        (Tensor::from_vec(vec![i64::MAX], [1]), 0usize),
        (Tensor::from_vec(vec![1i64], [1]), usize::MAX),
        (empty(&[0], DType::I64), usize::MAX),
    ] {
        let e = x.try_bincount(None, minlength).unwrap_err();
        assert!(
            matches!(e, KilnError::TooLarge { op: "bincount", .. }),
            "{e}"
        );
    }
    let w = Tensor::from_vec(vec![2.0f32], [1]);
    let e = Tensor::from_vec(vec![i64::MAX], [1])
        .try_bincount(Some(&w), 0)
        .unwrap_err();
    assert!(
        matches!(e, KilnError::TooLarge { op: "bincount", .. }),
        "{e}"
    );
    let c = Tensor::from_vec(vec![3i64, 1, 3], [3])
        .try_bincount(Some(&w.try_broadcast_to([3]).unwrap()), 2)
        .unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![0.0, 2.0, 0.0, 4.0]);
}

#[test]
fn plateau_and_scheduler_state_survive_hostile_values() {
    use kiln::optim::{
        ExponentialLr, LrScheduler, Optimizer, PlateauMode, ReduceLrOnPlateau,
        ReduceLrOnPlateauOptions, Sgd, ThresholdMode,
    };
    let mut s = Sweep::new("plateau/state");
    // Options PyTorch refuses are refused by name.
    for (label, o) in [
        (
            "factor 1",
            ReduceLrOnPlateauOptions {
                factor: 1.0,
                ..Default::default()
            },
        ),
        (
            "factor nan",
            ReduceLrOnPlateauOptions {
                factor: f64::NAN,
                ..Default::default()
            },
        ),
        (
            "factor negative",
            ReduceLrOnPlateauOptions {
                factor: -0.5,
                ..Default::default()
            },
        ),
        (
            "threshold nan",
            ReduceLrOnPlateauOptions {
                threshold: f64::NAN,
                ..Default::default()
            },
        ),
        (
            "min_lr negative",
            ReduceLrOnPlateauOptions {
                min_lr: -1.0,
                ..Default::default()
            },
        ),
        (
            "eps nan",
            ReduceLrOnPlateauOptions {
                eps: f64::NAN,
                ..Default::default()
            },
        ),
    ] {
        let r = s.run(label, move || {
            ReduceLrOnPlateau::new(o)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        match r {
            Some(Err(e)) if e.contains("ReduceLrOnPlateau") => {}
            other => s.fail(
                label,
                format!("expected a refusal naming the op, got {other:?}"),
            ),
        }
    }
    // NaN, infinite and huge metrics: NaN never improves (as in PyTorch), rates stay numbers
    // and never fall below min_lr.
    for (mode, th) in [
        (PlateauMode::Min, ThresholdMode::Rel),
        (PlateauMode::Max, ThresholdMode::Abs),
    ] {
        let case = format!("plateau {mode:?} {th:?}");
        let r = s.run(&case, move || -> Result<Vec<f64>, String> {
            let p = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
            let mut opt = Sgd::new(vec![p], 0.1).map_err(|e| e.to_string())?;
            let o = ReduceLrOnPlateauOptions {
                mode,
                threshold_mode: th,
                patience: 0,
                min_lr: 1e-3,
                ..Default::default()
            };
            let mut plateau = ReduceLrOnPlateau::new(o).map_err(|e| e.to_string())?;
            let mut lrs = Vec::new();
            for m in [
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                1e308,
                -1e308,
                f64::NAN,
                0.0,
                f64::NAN,
            ] {
                plateau.step(&mut opt, m);
                lrs.push(opt.group_lrs()[0]);
            }
            Ok(lrs)
        });
        match r {
            Some(Ok(lrs)) if lrs.iter().all(|&l| (1e-3..=0.1).contains(&l)) => {}
            other => s.fail(&case, format!("rates {other:?}")),
        }
    }
    // A scheduler state with NaN, negative or fractional counters is refused by name.
    for (label, value) in [
        ("nan", f64::NAN),
        ("negative", -1.0),
        ("fraction", 0.5),
        ("huge", 1e300),
    ] {
        let r = s.run(label, move || -> Result<(), String> {
            let p = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
            let mut opt = Sgd::new(vec![p], 0.1).map_err(|e| e.to_string())?;
            let mut sched = LrScheduler::new(&mut opt, ExponentialLr { gamma: 0.5 })
                .map_err(|e| e.to_string())?;
            let mut sd = sched.state_dict().map_err(|e| e.to_string())?;
            for (name, t) in sd.iter_mut() {
                if name == "last_epoch" {
                    *t = Tensor::try_full_on(t.shape(), value, t.dtype(), t.device())
                        .map_err(|e| e.to_string())?;
                }
            }
            sched.load_state_dict(&sd).map_err(|e| e.to_string())
        });
        match r {
            Some(Err(e)) if e.contains("load_state_dict") => {}
            other => s.fail(
                &format!("load_state_dict(last_epoch {label})"),
                format!("{other:?}"),
            ),
        }
    }
    s.finish();
}
