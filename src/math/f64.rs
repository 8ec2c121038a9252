//! Scalar special functions in f64, shared by the CPU backend's f64 kernels and the
//! reference evaluator: logistic, exact GELU, erfc, and wrapping integer powers.

/// Logistic function in f64, accurate for large negative inputs.
pub fn sigmoid(a: f64) -> f64 {
    if a >= 0.0 {
        1.0 / (1.0 + (-a).exp())
    } else {
        let e = a.exp();
        e / (1.0 + e)
    }
}

/// Exact GELU in f64 (`x·Φ(x)` through `erfc`, accurate for negative x).
pub fn gelu(x: f64) -> f64 {
    0.5 * x * erfc(-x / std::f64::consts::SQRT_2)
}

/// Complementary error function in f64: Taylor series of erf near 0, a continued fraction
/// (modified Lentz) elsewhere; about 1e-15 relative.
pub fn erfc(x: f64) -> f64 {
    let ax = x.abs();
    if ax < 0.5 {
        // erf series: 2/sqrt(pi) Σ (-1)^n x^(2n+1) / (n! (2n+1))
        let x2 = x * x;
        let (mut term, mut sum, mut n) = (x, x, 0.0f64);
        loop {
            n += 1.0;
            term *= -x2 / n;
            let add = term / (2.0 * n + 1.0);
            sum += add;
            if add.abs() <= 1e-17 * sum.abs() || n > 60.0 {
                break;
            }
        }
        return 1.0 - sum * std::f64::consts::FRAC_2_SQRT_PI;
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
