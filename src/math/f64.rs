//! Scalar special functions in f64, shared by the CPU backend's f64 kernels and the
//! reference evaluator: logistic, exact GELU, erfc, wrapping integer powers, and the
//! inverse hyperbolic functions.

/// Logistic function in f64, accurate for large negative inputs.
pub fn sigmoid(a: f64) -> f64 {
    if a >= 0.0 {
        1.0 / (1.0 + (-a).exp())
    } else {
        let e = a.exp();
        e / (1.0 + e)
    }
}

/// PyTorch's `softplus` (`beta = 1`, `threshold = 20`) in f64: `x` above 20, else
/// `ln(1 + e^x)` as `max(x, 0) + ln(1 + e^-|x|)` (no overflow, no cancellation).
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        return x;
    }
    let l = (-x.abs()).exp().ln_1p();
    if x > 0.0 { x + l } else { l }
}

/// SiLU `x · sigmoid(x)` in f64 (`silu(-inf)` is NaN, as PyTorch's `x / (1 + e^-x)`).
pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// Exact GELU in f64 (`x·Φ(x)` through `erfc`, accurate for negative x).
pub fn gelu(x: f64) -> f64 {
    // At -inf, Φ(x) is exactly 0 and the limit of x·Φ(x) is -0 (as the f32 kernel gives),
    // not `-inf * 0 = NaN`.
    if x == f64::NEG_INFINITY {
        return -0.0;
    }
    0.5 * x * erfc(-x / std::f64::consts::SQRT_2)
}

/// `erf(x)` by its Taylor series, for `|x| < ERF_SERIES_MAX` (the terms stay small enough
/// there that the alternating sum keeps about 15 digits).
fn erf_series(x: f64) -> f64 {
    // erf x = 2/sqrt(pi) Σ (-1)^n x^(2n+1) / (n! (2n+1))
    let x2 = x * x;
    let (mut term, mut sum, mut n) = (x, x, 0.0f64);
    loop {
        n += 1.0;
        term *= -x2 / n;
        let add = term / (2.0 * n + 1.0);
        sum += add;
        if add.abs() <= 1e-17 * sum.abs() || n > 80.0 {
            break;
        }
    }
    sum * std::f64::consts::FRAC_2_SQRT_PI
}

/// Below this, erf and erfc use the series; above it, erfc's continued fraction (which
/// converges in a few dozen terms there).
const ERF_SERIES_MAX: f64 = 1.5;

/// Error function in f64: the Taylor series for `|x| < 1.5`, `1 - erfc` beyond; about
/// 1e-15 relative.
pub fn erf(x: f64) -> f64 {
    if x.abs() < ERF_SERIES_MAX {
        erf_series(x)
    } else if x.is_nan() {
        x
    } else {
        x.signum() * (1.0 - erfc(x.abs()))
    }
}

/// Complementary error function in f64: `1 - erf` by the series for `|x| < 1.5`, a
/// continued fraction (modified Lentz) beyond; about 1e-15 relative (gelu and the
/// reference evaluator use it).
pub fn erfc(x: f64) -> f64 {
    let ax = x.abs();
    if ax < ERF_SERIES_MAX {
        return 1.0 - erf_series(x);
    }
    if ax == f64::INFINITY {
        return if x > 0.0 { 0.0 } else { 2.0 };
    }
    // Continued fraction for erfc(ax), ax >= 0.5 (modified Lentz).
    let tiny = 1e-300;
    let mut f = ax;
    if f == 0.0 {
        f = tiny;
    }
    let (mut c, mut d) = (f, 0.0f64);
    let mut k = 1.0f64;
    loop {
        let an = k * 0.5;
        d = ax + an * d;
        if d == 0.0 {
            d = tiny;
        }
        c = ax + an / c;
        if c == 0.0 {
            c = tiny;
        }
        d = 1.0 / d;
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 || k > 500.0 {
            break;
        }
        k += 1.0;
    }
    let r = (-ax * ax).exp() / f / std::f64::consts::PI.sqrt();
    if x >= 0.0 { r } else { 2.0 - r }
}

/// Integer power with wrapping; negative exponents give the truncated real result.
pub fn int_pow(base: i64, exp: i64) -> i64 {
    if exp < 0 {
        return match base {
            1 => 1,
            -1 => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut b, mut e, mut r) = (base, exp as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            r = r.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    r
}

/// Above this magnitude `asinh` and `acosh` are `ln(2|x|)` to working precision (the
/// neglected term is below `2^-56` relative).
const HUGE: f64 = 268_435_456.0; // 2^28

/// Inverse hyperbolic sine without cancellation or overflow: `ln(2|x|)` for huge `|x|`,
/// `ln(2a + 1/(sqrt(a² + 1) + a))` above 2, and `log1p(a + a²/(1 + sqrt(1 + a²)))` below
/// (the classic fdlibm split), with `x`'s sign (`asinh(-0) = -0`).
pub fn asinh(x: f64) -> f64 {
    let a = x.abs();
    let r = if a > HUGE {
        a.ln() + core::f64::consts::LN_2
    } else if a > 2.0 {
        (2.0 * a + 1.0 / ((a * a + 1.0).sqrt() + a)).ln()
    } else {
        let a2 = a * a;
        (a + a2 / (1.0 + (1.0 + a2).sqrt())).ln_1p()
    };
    r.copysign(x)
}

/// Inverse hyperbolic cosine, NaN below 1: `ln(2x)` for huge `x`,
/// `ln(2x - 1/(x + sqrt(x² - 1)))` above 2, and `log1p(t + sqrt(2t + t²))` with the exact
/// `t = x - 1` near 1 (where `ln(x + sqrt(x² - 1))` loses the small result).
pub fn acosh(x: f64) -> f64 {
    if x.is_nan() || x < 1.0 {
        return f64::NAN;
    }
    if x > HUGE {
        x.ln() + core::f64::consts::LN_2
    } else if x > 2.0 {
        (2.0 * x - 1.0 / (x + (x * x - 1.0).sqrt())).ln()
    } else {
        let t = x - 1.0;
        (t + (2.0 * t + t * t).sqrt()).ln_1p()
    }
}

/// Inverse hyperbolic tangent, `½·log1p(2a/(1 - a))` of `a = |x|` with `x`'s sign (so no
/// `log1p` argument comes near -1, as it does for negative `x` in the unsigned form), and
/// `2a + 2a²/(1 - a)` as that argument below ½. `±inf` at `±1`, NaN beyond.
pub fn atanh(x: f64) -> f64 {
    let a = x.abs();
    let u = if a < 0.5 {
        let t = a + a;
        t + t * a / (1.0 - a)
    } else {
        (a + a) / (1.0 - a)
    };
    (0.5 * u.ln_1p()).copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_and_erfc_match_tabulated_values() {
        // (x, erf x, erfc x) from standard tables (20+ significant digits, rounded).
        let table = [
            (0.1, 0.112_462_916_018_284_9, 0.887_537_083_981_715),
            (0.5, 0.520_499_877_813_046_5, 0.479_500_122_186_953_5),
            (0.7, 0.677_801_193_837_418_5, 0.322_198_806_162_581_5),
            (1.0, 0.842_700_792_949_714_9, 0.157_299_207_050_285_1),
            (1.4, 0.952_285_119_762_648_8, 0.047_714_880_237_351_2),
            (2.0, 0.995_322_265_018_952_7, 0.004_677_734_981_047_266),
            (3.0, 0.999_977_909_503_001_4, 2.209_049_699_858_544e-5),
        ];
        for (x, e, c) in table {
            assert!(((erf(x) - e) / e).abs() < 4e-15, "erf({x}) = {}", erf(x));
            assert!(((erfc(x) - c) / c).abs() < 4e-14, "erfc({x}) = {}", erfc(x));
            assert_eq!(erf(-x), -erf(x));
            assert!((erfc(-x) - (2.0 - c)).abs() < 1e-15);
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erfc(0.0), 1.0);
        assert!(erf(f64::NAN).is_nan());
        assert_eq!(erf(f64::INFINITY), 1.0);
        assert_eq!(erfc(40.0), 0.0);
    }

    #[test]
    fn inverse_hyperbolic_functions_invert_and_keep_small_results() {
        // Round trips through sinh / cosh / tanh over every branch (near 0, around the
        // switches at 1/2 and 2, and huge arguments), within a few ulp of the argument.
        let mut y: f64 = 1e-12;
        while y < 300.0 {
            let close = |got: f64, want: f64, what: &str| {
                assert!(
                    (got - want).abs() <= 4.0 * f64::EPSILON * want.abs(),
                    "{what}({y}) = {got}, want {want}"
                );
            };
            close(asinh(y.sinh()), y, "asinh∘sinh");
            close(asinh(-y.sinh()), -y, "asinh∘sinh");
            if y > 1.0 {
                // Below, rounding cosh(y) near 1 already moves the round trip (acosh's
                // slope is 1/sinh(y)); the near-1 branch is checked by the series below.
                close(acosh(y.cosh()), y, "acosh∘cosh");
            }
            if y < 0.7 {
                // Beyond, rounding tanh(y) near 1 moves the round trip by cosh²(y) ulp.
                close(atanh(y.tanh()), y, "atanh∘tanh");
                close(atanh(-y.tanh()), -y, "atanh∘tanh");
            }
            y *= 1.37;
        }
        // Near 1, acosh(1 + t) = sqrt(2t)·(1 - t/12 + ...), which ln(x + sqrt(x² - 1))
        // gets wrong in most of its digits.
        let t: f64 = 1e-10;
        let want = (2.0 * t).sqrt() * (1.0 - t / 12.0);
        assert!((acosh(1.0 + t) - want).abs() <= 1e-6 * want);
        assert_eq!(atanh(1.0), f64::INFINITY);
        assert_eq!(atanh(-1.0), f64::NEG_INFINITY);
        assert!(atanh(1.5).is_nan() && acosh(0.5).is_nan() && acosh(f64::NAN).is_nan());
        assert_eq!(asinh(-0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(atanh(-0.0).to_bits(), (-0.0f64).to_bits());
        assert_eq!(asinh(f64::NEG_INFINITY), f64::NEG_INFINITY);
        assert_eq!(acosh(f64::INFINITY), f64::INFINITY);
        assert_eq!(acosh(1.0), 0.0);
    }

    #[test]
    fn gelu_is_accurate_around_the_method_switch() {
        // gelu(x) = x Φ(x): check against 0.5 x (1 + erf(x/√2)) across x/√2 = 1.5 (where
        // that formula does not cancel: x > -1.5).
        for i in 0..300 {
            let x = -1.5 + i as f64 * 0.02;
            let want = 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2));
            let got = gelu(x);
            assert!(
                (got - want).abs() <= 1e-14 * want.abs().max(1e-3),
                "gelu({x})"
            );
        }
    }
}
