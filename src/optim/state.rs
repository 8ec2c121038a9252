//! Saving and restoring an optimizer's state: PyTorch's `optimizer.state_dict()` and
//! `optimizer.load_state_dict()`, as a flat list of named tensors that
//! `kiln::io::save` writes and `kiln::io::load` reads back.
//!
//! Names follow PyTorch's state dict, flattened with dots: `state.{i}.{slot}` for parameter
//! `i`'s state (`exp_avg`, `exp_avg_sq`, `momentum_buffer`, `step`, ...) and
//! `param_groups.{g}.{option}` for group `g`'s options (`lr`, `betas.0`, `weight_decay`,
//! `amsgrad`, ...), plus `steps`, the optimizer's own step count. Buffers keep their
//! parameter's dtype and shape; counters and options are 0-d f64 tensors (flags 0 or 1).
//!
//! Loading checks every name, shape and dtype first and reports every mismatch in one
//! error, then checks every counter and flag, and only then writes: the state buffers are
//! overwritten in place (they keep their identity, so a cached step plan stays valid),
//! and the counters and options are set.

use crate::autograd::no_grad;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;
use std::collections::HashMap;

/// One buffer of an optimizer's state, which its steps update in place.
pub(crate) struct StateBuffer {
    /// The buffer.
    pub(crate) buffer: Tensor,
    /// Its entries: one name saves the whole buffer; several save one row each of a
    /// stacked `[rows, ..]` buffer, in row order.
    pub(crate) names: Vec<String>,
}

impl StateBuffer {
    /// `buffer` saved whole as `state.{i}.{slot}`.
    pub(crate) fn whole(i: usize, slot: &str, buffer: &Tensor) -> StateBuffer {
        StateBuffer {
            buffer: buffer.clone(),
            names: vec![format!("state.{i}.{slot}")],
        }
    }

    /// A stacked `[slots.len(), ..]` buffer saved as one `state.{i}.{slot}` per row.
    pub(crate) fn rows(i: usize, slots: &[&str], buffer: &Tensor) -> StateBuffer {
        StateBuffer {
            buffer: buffer.clone(),
            names: slots.iter().map(|s| format!("state.{i}.{s}")).collect(),
        }
    }
}

/// What a scalar of the state may hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ScalarKind {
    /// A count: a whole number, at least 0.
    Count,
    /// A flag: 0 or 1.
    Flag,
    /// A number (an option such as a learning rate): anything but NaN.
    Real,
}

impl ScalarKind {
    /// Whether `v` is a value of this kind.
    fn admits(self, v: f64) -> bool {
        match self {
            ScalarKind::Count => v >= 0.0 && v.fract() == 0.0 && v <= 2f64.powi(53),
            ScalarKind::Flag => v == 0.0 || v == 1.0,
            ScalarKind::Real => !v.is_nan(),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            ScalarKind::Count => "a whole number of at least 0",
            ScalarKind::Flag => "0 or 1",
            ScalarKind::Real => "a number",
        }
    }
}

/// One scalar of the state: its name, value and kind.
pub(crate) type StateScalar = (String, f64, ScalarKind);

/// What an optimizer exposes so that [`state_dict`] and [`load_state_dict`] can save and
/// restore it.
pub(crate) trait StateParts {
    /// Its name in errors.
    const NAME: &'static str;
    /// Every state buffer, in a fixed order.
    fn buffers(&self) -> Vec<StateBuffer>;
    /// Every counter and option, in a fixed order.
    fn scalars(&self) -> Vec<StateScalar>;
    /// Sets the scalar `name` (one [`scalars`](StateParts::scalars) lists) to `value`,
    /// already checked against its kind.
    fn set_scalar(&mut self, name: &str, value: f64);
    /// Called after the buffers were overwritten (to rebuild views of them).
    fn restored(&mut self) -> Result<()> {
        Ok(())
    }
}

/// An optimizer's group options as named scalars (see [`option_fields`]).
pub(crate) trait GroupFields {
    /// Every option, by PyTorch's name (pairs as `name.0`, `name.1`).
    fn fields(&self) -> Vec<(&'static str, f64, ScalarKind)>;
    /// Sets the option `name` (one [`fields`](GroupFields::fields) lists).
    fn set_field(&mut self, name: &str, value: f64);
}

/// `param_groups.{g}.{option}` for every group's options.
fn group_scalars<O: GroupFields>(groups: &[O]) -> Vec<StateScalar> {
    let mut out = vec![];
    for (g, o) in groups.iter().enumerate() {
        for (name, v, kind) in o.fields() {
            out.push((format!("param_groups.{g}.{name}"), v, kind));
        }
    }
    out
}

/// Sets `name` if it is a `param_groups.{g}.{option}` name; returns whether it was.
fn set_group_scalar<O: GroupFields>(groups: &mut [O], name: &str, v: f64) -> bool {
    let Some(rest) = name.strip_prefix("param_groups.") else {
        return false;
    };
    let Some((g, field)) = rest.split_once('.') else {
        return false;
    };
    match g.parse::<usize>().ok().and_then(|g| groups.get_mut(g)) {
        Some(o) => {
            o.set_field(field, v);
            true
        }
        None => false,
    }
}

/// The scalars most optimizers keep: each parameter's step count `state.{i}.step` (for
/// those that count per parameter; pass `&[]` otherwise), the optimizer's `steps`, and
/// every group's options.
pub(crate) fn counted_scalars<O: GroupFields>(
    param_steps: &[u64],
    steps: u64,
    groups: &[O],
) -> Vec<StateScalar> {
    let mut out: Vec<StateScalar> = (param_steps.iter().enumerate())
        .map(|(i, &c)| (format!("state.{i}.step"), c as f64, ScalarKind::Count))
        .collect();
    out.push(("steps".into(), steps as f64, ScalarKind::Count));
    out.extend(group_scalars(groups));
    out
}

/// Sets one of [`counted_scalars`]' names to `v`; returns whether it was one of them.
pub(crate) fn set_counted_scalar<O: GroupFields>(
    name: &str,
    v: f64,
    param_steps: &mut [u64],
    steps: &mut u64,
    groups: &mut [O],
) -> bool {
    if name == "steps" {
        *steps = v as u64;
        true
    } else if let Some(i) = param_index(name, "step") {
        param_steps.get_mut(i).map(|s| *s = v as u64).is_some()
    } else {
        set_group_scalar(groups, name, v)
    }
}

/// The parameter index of a `state.{i}.{slot}` name with that `slot`.
pub(crate) fn param_index(name: &str, slot: &str) -> Option<usize> {
    let rest = name.strip_prefix("state.")?;
    let (i, s) = rest.split_once('.')?;
    if s == slot { i.parse().ok() } else { None }
}

/// Implements [`GroupFields`] for an options struct: its plain numbers, its pairs (saved
/// as `name.0` and `name.1`) and its flags.
macro_rules! option_fields {
    ($ty:ty { numbers: [$($n:ident),*], pairs: [$($p:ident),*], flags: [$($b:ident),*] }) => {
        impl $crate::optim::state::GroupFields for $ty {
            fn fields(&self) -> Vec<(&'static str, f64, $crate::optim::state::ScalarKind)> {
                use $crate::optim::state::ScalarKind::{Flag, Real};
                vec![
                    $((stringify!($n), self.$n, Real),)*
                    $(
                        (concat!(stringify!($p), ".0"), self.$p.0, Real),
                        (concat!(stringify!($p), ".1"), self.$p.1, Real),
                    )*
                    $((stringify!($b), f64::from(u8::from(self.$b)), Flag),)*
                ]
            }

            fn set_field(&mut self, name: &str, value: f64) {
                match name {
                    $(stringify!($n) => self.$n = value,)*
                    $(
                        concat!(stringify!($p), ".0") => self.$p.0 = value,
                        concat!(stringify!($p), ".1") => self.$p.1 = value,
                    )*
                    $(stringify!($b) => self.$b = value != 0.0,)*
                    _ => {}
                }
            }
        }
    };
}
pub(crate) use option_fields;

/// The [`StateParts`] methods `scalars` and `set_scalar` for an optimizer whose scalars
/// are [`counted_scalars`]: its `steps` and `groups` fields, and the per-parameter step
/// counts in the named field (none when no field is named).
macro_rules! counted_scalar_methods {
    ($($param_steps:ident)?) => {
        fn scalars(&self) -> Vec<$crate::optim::state::StateScalar> {
            let [per_param, ..]: [&[u64]; _] = [$(&self.$param_steps[..],)? &[]];
            $crate::optim::state::counted_scalars(per_param, self.steps, &self.groups)
        }

        fn set_scalar(&mut self, name: &str, v: f64) {
            let [per_param, ..]: [&mut [u64]; _] = [$(&mut self.$param_steps[..],)? &mut []];
            $crate::optim::state::set_counted_scalar(
                name,
                v,
                per_param,
                &mut self.steps,
                &mut self.groups,
            );
        }
    };
}
pub(crate) use counted_scalar_methods;

/// The [`Optimizer`](super::Optimizer) methods `state_dict` and `load_state_dict` for an
/// optimizer that implements [`StateParts`].
macro_rules! state_dict_methods {
    () => {
        fn state_dict(&self) -> $crate::error::Result<Vec<(String, $crate::tensor::Tensor)>> {
            $crate::optim::state::state_dict(self)
        }

        fn load_state_dict(
            &mut self,
            state: &[(String, $crate::tensor::Tensor)],
        ) -> $crate::error::Result<()> {
            $crate::optim::state::load_state_dict(self, state)
        }
    };
}
pub(crate) use state_dict_methods;

/// `scalars` as 0-d f64 CPU tensors.
pub(crate) fn scalar_tensors(scalars: Vec<StateScalar>) -> Result<Vec<(String, Tensor)>> {
    scalars
        .into_iter()
        .map(|(name, v, _)| {
            Ok((
                name,
                Tensor::try_full_on((), v, DType::F64, crate::Device::Cpu)?,
            ))
        })
        .collect()
}

/// Checks that `state` holds exactly the names of `wanted`, with their shapes and dtypes,
/// reporting every mismatch in one error of `op`.
fn check_names(
    op: &'static str,
    wanted: &[(String, Tensor)],
    state: &[(String, Tensor)],
) -> Result<()> {
    let stored: Vec<crate::io::Stored> = state
        .iter()
        .map(|(n, t)| crate::io::Stored::of(n, t))
        .collect();
    let problems = crate::io::mismatches(wanted, &stored, ("state", "expected"));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(crate::io::mismatch_error(
            op,
            "the state does not match",
            &problems,
        ))
    }
}

/// The value `state` holds for each of `scalars` (in their order), checked against its
/// kind; refuses the first that is not of its kind.
fn read_scalars(
    op: &'static str,
    scalars: Vec<StateScalar>,
    by_name: &HashMap<&str, &Tensor>,
) -> Result<Vec<(String, f64)>> {
    let mut out = Vec::with_capacity(scalars.len());
    for (name, _, kind) in scalars {
        let t = by_name
            .get(name.as_str())
            .ok_or_else(|| KilnError::Internal(format!("{op}: {name:?} vanished")))?;
        let v = t.try_cast(DType::F64)?.to_vec::<f64>()?;
        let v = v.first().copied().unwrap_or(f64::NAN);
        if !kind.admits(v) {
            return Err(KilnError::InvalidArgument {
                op,
                shape: vec![],
                reason: format!("{name} is {v}, which is not {}", kind.describe()),
            });
        }
        out.push((name, v));
    }
    Ok(out)
}

/// Restores a state made of scalars alone (a scheduler's): checks the names, shapes and
/// dtypes of `state` against `scalars`, then each value against its kind, and returns the
/// values in `scalars`' order.
pub(crate) fn load_scalars(
    op: &'static str,
    scalars: Vec<StateScalar>,
    state: &[(String, Tensor)],
) -> Result<Vec<(String, f64)>> {
    check_names(op, &scalar_tensors(scalars.clone())?, state)?;
    let by_name: HashMap<&str, &Tensor> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    read_scalars(op, scalars, &by_name)
}

/// The state of `opt` as named tensors: each buffer (or each row of a stacked one) as it
/// is now, then every scalar as a 0-d f64 CPU tensor.
pub(crate) fn state_dict<T: StateParts>(opt: &T) -> Result<Vec<(String, Tensor)>> {
    let mut out = vec![];
    for b in opt.buffers() {
        if let [name] = &b.names[..] {
            out.push((name.clone(), b.buffer.detach()));
            continue;
        }
        for (r, name) in b.names.iter().enumerate() {
            let r = r as isize;
            let shape: Vec<isize> = b.buffer.shape()[1..].iter().map(|&d| d as isize).collect();
            let row = b
                .buffer
                .try_slice_dim(0, r, r + 1, 1)?
                .try_reshape(&shape)?;
            out.push((name.clone(), row));
        }
    }
    for (name, v, _) in opt.scalars() {
        out.push((
            name,
            Tensor::try_full_on((), v, DType::F64, crate::Device::Cpu)?,
        ));
    }
    Ok(out)
}

/// Restores `opt` from `state` (what [`state_dict`] gave for an optimizer of the same
/// structure): checks everything first, then writes.
pub(crate) fn load_state_dict<T: StateParts>(
    opt: &mut T,
    state: &[(String, Tensor)],
) -> Result<()> {
    let op = T::NAME;
    check_names(op, &state_dict(opt)?, state)?;
    let by_name: HashMap<&str, &Tensor> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let given = |name: &str| -> Result<&Tensor> {
        by_name
            .get(name)
            .copied()
            .ok_or_else(|| KilnError::Internal(format!("{op}: {name:?} vanished")))
    };
    // Every scalar is read and checked before anything is written.
    let scalars = read_scalars(op, opt.scalars(), &by_name)?;
    let buffers = opt.buffers();
    let mut values = Vec::with_capacity(buffers.len());
    for b in &buffers {
        let parts = b
            .names
            .iter()
            .map(|n| {
                let t = given(n)?;
                if t.device() == b.buffer.device() {
                    Ok(t.clone())
                } else {
                    t.try_to(b.buffer.device())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        values.push(match &parts[..] {
            [one] => one.clone(),
            _ => Tensor::try_stack(&parts.iter().collect::<Vec<_>>(), 0)?,
        });
    }
    no_grad(|| {
        for (b, v) in buffers.iter().zip(&values) {
            b.buffer.try_copy_(v)?;
        }
        Ok::<(), KilnError>(())
    })?;
    let all: Vec<&Tensor> = buffers.iter().map(|b| &b.buffer).collect();
    crate::tensor::realize_all(&all)?;
    for (name, v) in scalars {
        opt.set_scalar(&name, v);
    }
    opt.restored()
}
