//! `+ - * /` and unary `-` on `Tensor` and `&Tensor`, with number literals on either side.
//! They panic with the op's error text on bad input; use the `try_` methods to handle errors.

use super::{Tensor, unwrap_or_panic};
use crate::dtype::Scalar;
use std::ops::{Add, Div, Mul, Neg, Sub};

macro_rules! tensor_tensor {
    ($trait:ident, $method:ident) => {
        impl $trait<Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(&self, &rhs)
            }
        }
        impl $trait<&Tensor> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(&self, rhs)
            }
        }
        impl $trait<Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: Tensor) -> Tensor {
                Tensor::$method(self, &rhs)
            }
        }
        impl $trait<&Tensor> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, rhs: &Tensor) -> Tensor {
                Tensor::$method(self, rhs)
            }
        }
    };
}

tensor_tensor!(Add, add);
tensor_tensor!(Sub, sub);
tensor_tensor!(Mul, mul);
tensor_tensor!(Div, div);

/// The Rust number types that work as scalars on either side of `+ - * /`: f64, f32, i64,
/// i32 and u8 (bool is not arithmetic). Sealed.
pub trait ScalarOperand: Into<Scalar> + Copy + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! scalar_operand {
    ($($s:ty),*) => {$(
        impl private::Sealed for $s {}
        impl ScalarOperand for $s {}
    )*};
}
scalar_operand!(f64, f32, i64, i32, u8);

// Tensor on the left: one generic impl per operator, so a literal on the right (`&x + 1.0`)
// selects it before the literal's type is settled and the result is known to be a Tensor.
macro_rules! tensor_scalar_rhs {
    ($($trait:ident, $method:ident;)*) => {$(
        impl<S: ScalarOperand> $trait<S> for Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, r: S) -> Tensor {
                Tensor::$method(&self, r.into())
            }
        }
        impl<S: ScalarOperand> $trait<S> for &Tensor {
            type Output = Tensor;
            #[track_caller]
            fn $method(self, r: S) -> Tensor {
                Tensor::$method(self, r.into())
            }
        }
    )*};
}
tensor_scalar_rhs! {
    Add, add;
    Sub, sub;
    Mul, mul;
    Div, div;
}

// Number on the left: one impl per type (the orphan rule allows no generic one), and only
// one float and one integer type, so that a literal (`1.0 - &p`, `2 * &x`) needs no suffix:
// with impls for both f32 and f64, Rust could not pick a type for `1.0`. Rust's own
// fallback types would be f64 and i32; i64 is kiln's (and PyTorch's) integer default, and
// an unannotated `let n = 2;` used on the left infers i64 from the single impl. A variable
// declared f32/i32/u8 goes on the right (`&x * lr`), or through `rsub`/`rdiv`/`rpow`.
macro_rules! scalar_tensor_lhs {
    ($($s:ty),*) => {$(
        impl Add<Tensor> for $s { type Output = Tensor; #[track_caller] fn add(self, r: Tensor) -> Tensor { Tensor::add(&r, self) } }
        impl Add<&Tensor> for $s { type Output = Tensor; #[track_caller] fn add(self, r: &Tensor) -> Tensor { Tensor::add(r, self) } }
        impl Mul<Tensor> for $s { type Output = Tensor; #[track_caller] fn mul(self, r: Tensor) -> Tensor { Tensor::mul(&r, self) } }
        impl Mul<&Tensor> for $s { type Output = Tensor; #[track_caller] fn mul(self, r: &Tensor) -> Tensor { Tensor::mul(r, self) } }
        impl Sub<Tensor> for $s { type Output = Tensor; #[track_caller] fn sub(self, r: Tensor) -> Tensor { unwrap_or_panic(r.try_rsub(self)) } }
        impl Sub<&Tensor> for $s { type Output = Tensor; #[track_caller] fn sub(self, r: &Tensor) -> Tensor { unwrap_or_panic(r.try_rsub(self)) } }
        impl Div<Tensor> for $s { type Output = Tensor; #[track_caller] fn div(self, r: Tensor) -> Tensor { unwrap_or_panic(r.try_rdiv(self)) } }
        impl Div<&Tensor> for $s { type Output = Tensor; #[track_caller] fn div(self, r: &Tensor) -> Tensor { unwrap_or_panic(r.try_rdiv(self)) } }
    )*};
}
scalar_tensor_lhs!(f64, i64);

impl Neg for Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(&self)
    }
}

impl Neg for &Tensor {
    type Output = Tensor;
    #[track_caller]
    fn neg(self) -> Tensor {
        Tensor::neg(self)
    }
}
