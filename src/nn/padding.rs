//! PyTorch's `F.pad` with its four modes, and the padding modules (`nn.ZeroPad2d`,
//! `nn.ConstantPad2d`, `nn.ReflectionPad2d`, `nn.ReplicationPad2d`, `nn.CircularPad2d` and
//! their 1-d and 3-d forms) as one [`Pad`].
//!
//! Constant padding is a view (negative amounts crop, as in PyTorch). The other modes pick,
//! for every output position along a padded dimension, the input position it copies (a
//! reflection, the nearest edge, or a wrap around): one `index_select` of a host-built
//! index per padded dimension, so it fuses with its neighbours and its gradient sums back
//! into the input positions each one copied.

use super::Module;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// How [`pad`] fills the border (PyTorch's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PadMode {
    /// A constant value (`"constant"`, the default).
    #[default]
    Constant,
    /// The input mirrored at its edge, the edge itself not repeated (`"reflect"`):
    /// `[1, 2, 3]` padded by 2 on the left is `[3, 2, 1, 2, 3]`.
    Reflect,
    /// The edge element repeated (`"replicate"`): `[1, 1, 1, 2, 3]`.
    Replicate,
    /// The input wrapped around (`"circular"`): `[2, 3, 1, 2, 3]`.
    Circular,
}

impl PadMode {
    fn name(self) -> &'static str {
        match self {
            PadMode::Constant => "constant",
            PadMode::Reflect => "reflect",
            PadMode::Replicate => "replicate",
            PadMode::Circular => "circular",
        }
    }
}

fn invalid(shape: &[usize], reason: String) -> KilnError {
    KilnError::InvalidArgument {
        op: "pad",
        shape: shape.to_vec(),
        reason,
    }
}

/// PyTorch's `F.pad(input, pad, mode, value)`. `pad` lists `(before, after)` amounts from
/// the **last** dimension backwards, as PyTorch's does: `[l, r]` pads the last dimension,
/// `[l, r, t, b]` the last two. `value` fills [`PadMode::Constant`] (and is ignored by the
/// other modes).
///
/// - `Constant`: any number of dimensions; a negative amount removes elements (a view).
/// - `Reflect`, `Replicate`, `Circular`: as PyTorch, 1, 2 or 3 trailing dimensions of an
///   input with one or two more dimensions (`[C, W]`/`[N, C, W]` for two amounts, and so
///   on), amounts ≥ 0; `Reflect` needs each amount below its dimension's size and
///   `Circular` at most that size.
///
/// Every violation is an `InvalidArgument` naming the mode, amounts and shape.
///
/// ```
/// use kiln::Tensor;
/// use kiln::nn::functional::{pad, PadMode};
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [1, 3]);
/// let r = pad(&x, &[2, 1], PadMode::Reflect, 0.0).unwrap();
/// assert_eq!(r.to_vec::<f32>().unwrap(), vec![3.0, 2.0, 1.0, 2.0, 3.0, 2.0]);
/// let e = pad(&x, &[2, 1], PadMode::Replicate, 0.0).unwrap();
/// assert_eq!(e.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 1.0, 2.0, 3.0, 3.0]);
/// let c = pad(&x, &[2, 1], PadMode::Circular, 0.0).unwrap();
/// assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 1.0, 2.0, 3.0, 1.0]);
/// let k = pad(&x, &[1, -1], PadMode::Constant, 9.0).unwrap();
/// assert_eq!(k.to_vec::<f32>().unwrap(), vec![9.0, 1.0, 2.0]);
/// ```
pub fn pad(input: &Tensor, pad: &[i64], mode: PadMode, value: f64) -> Result<Tensor> {
    let shape = input.shape();
    let pairs = pad.len() / 2;
    if !pad.len().is_multiple_of(2) || pairs > input.ndim() {
        return Err(invalid(
            shape,
            format!(
                "{pad:?} must be pairs of amounts, at most one pair per dimension ({} here)",
                input.ndim()
            ),
        ));
    }
    if mode == PadMode::Constant {
        return constant(input, pad, value);
    }
    if !(1..=3).contains(&pairs) || !(pairs + 1..=pairs + 2).contains(&input.ndim()) {
        return Err(invalid(
            shape,
            format!(
                "{} padding by {pad:?} takes 1, 2 or 3 trailing dimensions of an input with one \
                 or two more ({} or {} dimensions for these amounts)",
                mode.name(),
                pairs + 1,
                pairs + 2
            ),
        ));
    }
    let mut x = input.clone();
    for (k, amounts) in pad.chunks(2).enumerate() {
        let dim = input.ndim() - 1 - k;
        let (before, after) = (amounts[0], amounts[1]);
        let n = shape[dim] as i64;
        let limit_ok = match mode {
            PadMode::Reflect => before < n && after < n,
            PadMode::Circular => before <= n && after <= n,
            _ => n > 0,
        };
        if before < 0 || after < 0 || !limit_ok {
            let rule = match mode {
                PadMode::Reflect => "each amount must be ≥ 0 and below the dimension's size",
                PadMode::Circular => "each amount must be ≥ 0 and at most the dimension's size",
                _ => "each amount must be ≥ 0 and the dimension not empty",
            };
            return Err(invalid(
                shape,
                format!(
                    "{} padding by {pad:?}: dimension {dim} has size {n}; {rule}",
                    mode.name()
                ),
            ));
        }
        if before == 0 && after == 0 {
            continue;
        }
        let source: Vec<i64> = (-before..n + after)
            .map(|i| match mode {
                PadMode::Reflect if i < 0 => -i,
                PadMode::Reflect if i >= n => 2 * (n - 1) - i,
                PadMode::Replicate => i.clamp(0, n - 1),
                PadMode::Circular => i.rem_euclid(n),
                _ => i,
            })
            .collect();
        let len = source.len();
        let index = Tensor::try_from_vec(source, [len])?.try_to(input.device())?;
        x = x.try_index_select(dim as isize, &index)?;
    }
    Ok(x)
}

/// Constant padding: crops for negative amounts, then pads (views).
fn constant(input: &Tensor, pad: &[i64], value: f64) -> Result<Tensor> {
    let nd = input.ndim();
    let mut x = input.clone();
    let mut pads = vec![(0usize, 0usize); nd];
    for (k, amounts) in pad.chunks(2).enumerate() {
        let dim = nd - 1 - k;
        let (before, after) = (amounts[0], amounts[1]);
        let n = x.shape()[dim] as i64;
        let (cut_front, cut_back) = ((-before).max(0), (-after).max(0));
        if cut_front + cut_back > n {
            return Err(invalid(
                input.shape(),
                format!("padding by {pad:?} removes more than the {n} elements of dimension {dim}"),
            ));
        }
        if cut_front + cut_back > 0 {
            x = x.try_narrow(
                dim as isize,
                cut_front as isize,
                (n - cut_front - cut_back) as usize,
            )?;
        }
        pads[dim] = (before.max(0) as usize, after.max(0) as usize);
    }
    let value = if x.dtype().is_float() {
        crate::dtype::Scalar::Float(value)
    } else if x.dtype() == DType::Bool {
        crate::dtype::Scalar::Bool(value != 0.0)
    } else {
        crate::dtype::Scalar::Int(value as i64)
    };
    x.try_pad(&pads, value)
}

/// Padding as a layer: PyTorch's `nn.ZeroPad1d/2d/3d`, `nn.ConstantPad*`,
/// `nn.ReflectionPad*`, `nn.ReplicationPad*` and `nn.CircularPad*` in one type. The
/// amounts are PyTorch's: from the last dimension backwards, `(left, right, top, bottom,
/// front, back)`.
///
/// ```
/// use kiln::nn::{Module, Pad};
/// use kiln::Tensor;
/// // nn.ReflectionPad2d(1)
/// let layer = Pad::reflection(&[1, 1, 1, 1]);
/// assert_eq!(layer.forward(&Tensor::ones(&[1, 3, 4, 4])).unwrap().shape(), &[1, 3, 6, 6]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Pad {
    /// The amounts, last dimension first.
    pub padding: Vec<i64>,
    /// The mode.
    pub mode: PadMode,
    /// The fill of [`PadMode::Constant`].
    pub value: f64,
}

impl Pad {
    /// `nn.ZeroPad*d(padding)`.
    pub fn zero(padding: &[i64]) -> Pad {
        Pad::constant(padding, 0.0)
    }

    /// `nn.ConstantPad*d(padding, value)`.
    pub fn constant(padding: &[i64], value: f64) -> Pad {
        Pad {
            padding: padding.to_vec(),
            mode: PadMode::Constant,
            value,
        }
    }

    /// `nn.ReflectionPad*d(padding)`.
    pub fn reflection(padding: &[i64]) -> Pad {
        Pad {
            padding: padding.to_vec(),
            mode: PadMode::Reflect,
            value: 0.0,
        }
    }

    /// `nn.ReplicationPad*d(padding)`.
    pub fn replication(padding: &[i64]) -> Pad {
        Pad {
            padding: padding.to_vec(),
            mode: PadMode::Replicate,
            value: 0.0,
        }
    }

    /// `nn.CircularPad*d(padding)`.
    pub fn circular(padding: &[i64]) -> Pad {
        Pad {
            padding: padding.to_vec(),
            mode: PadMode::Circular,
            value: 0.0,
        }
    }
}

impl Module for Pad {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        pad(x, &self.padding, self.mode, self.value)
    }

    fn visit_parameters(&self, _: &mut dyn FnMut(&str, &Tensor)) {}

    fn visit_parameters_mut(&mut self, _: &mut dyn FnMut(&str, &mut Tensor)) {}

    /// No mode: the same in training and evaluation.
    fn set_training(&mut self, _training: bool) {}
}
