//! `+ - * /` and unary `-` on `Tensor` and `&Tensor`, with number literals on either side.
//! They panic with the op's error text on bad input; use the `try_` methods to handle errors.

use super::{Tensor, unwrap_or_panic};
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

macro_rules! tensor_scalar {
    ($($s:ty),*) => {$(
        impl Add<$s> for Tensor { type Output = Tensor; #[track_caller] fn add(self, r: $s) -> Tensor { Tensor::add(&self, r) } }
        impl Add<$s> for &Tensor { type Output = Tensor; #[track_caller] fn add(self, r: $s) -> Tensor { Tensor::add(self, r) } }
        impl Sub<$s> for Tensor { type Output = Tensor; #[track_caller] fn sub(self, r: $s) -> Tensor { Tensor::sub(&self, r) } }
        impl Sub<$s> for &Tensor { type Output = Tensor; #[track_caller] fn sub(self, r: $s) -> Tensor { Tensor::sub(self, r) } }
        impl Mul<$s> for Tensor { type Output = Tensor; #[track_caller] fn mul(self, r: $s) -> Tensor { Tensor::mul(&self, r) } }
        impl Mul<$s> for &Tensor { type Output = Tensor; #[track_caller] fn mul(self, r: $s) -> Tensor { Tensor::mul(self, r) } }
        impl Div<$s> for Tensor { type Output = Tensor; #[track_caller] fn div(self, r: $s) -> Tensor { Tensor::div(&self, r) } }
        impl Div<$s> for &Tensor { type Output = Tensor; #[track_caller] fn div(self, r: $s) -> Tensor { Tensor::div(self, r) } }

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

// Only f64 and i64: with a single float and a single integer impl, literals like `2.0` and
// `3` resolve without annotations. Other scalar types go through the methods (`x.mul(s)`).
tensor_scalar!(f64, i64);

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
