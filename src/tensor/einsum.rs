//! `einsum`: PyTorch's Einstein-summation form, recorded as the ops it stands for. Each
//! operand's repeated labels become a diagonal ([`Tensor::diagonal`]), labels no other operand
//! or the output needs are summed out first, and the operands are contracted left to right:
//! a pair sharing labels that the rest drops is one (batched) matrix product of permuted,
//! reshaped views; a pair sharing none is a broadcast product. The result is then permuted
//! into the output's order. Every step is an existing primitive, so einsum fuses, plans and
//! differentiates as they do.

use super::{Tensor, unwrap_or_panic};
use crate::error::{KilnError, Result};

/// A subscript label: a letter (its code) or one dimension of the ellipsis
/// (`ELLIPSIS + i`, `i` counted from the ellipsis' first dimension of the widest operand).
type Label = u32;
const ELLIPSIS: Label = 1 << 16;

impl Tensor {
    /// Einstein summation over `operands` as `torch.einsum(equation, *operands)`:
    /// `"ij,jk->ik"` is a matrix product, `"bij,bjk->bik"` a batched one, `"ii->"` a trace,
    /// `"...ij->...ji"` a transpose of the last two dimensions. Without `->` the output is
    /// every label used once, in alphabetical order (after the ellipsis' dimensions). Sizes
    /// of one label must agree or be 1 (broadcast), as ellipsis dimensions broadcast.
    ///
    /// ```
    /// use kiln::Tensor;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
    /// let b = Tensor::from_vec(vec![5.0f32, 6.0, 7.0, 8.0], &[2, 2]);
    /// let c = Tensor::einsum("ij,jk->ik", &[&a, &b]);
    /// assert_eq!(c.to_vec::<f32>().unwrap(), a.matmul(&b).to_vec::<f32>().unwrap());
    /// assert_eq!(Tensor::einsum("ii", &[&a]).item::<f32>().unwrap(), 5.0);
    /// ```
    #[track_caller]
    pub fn einsum(equation: &str, operands: &[&Tensor]) -> Tensor {
        unwrap_or_panic(Tensor::try_einsum(equation, operands))
    }

    /// Fallible [`Tensor::einsum`]: a malformed equation, a count of operands or dimensions
    /// that does not match it, or sizes of one label that disagree are errors naming the
    /// equation and the shapes.
    pub fn try_einsum(equation: &str, operands: &[&Tensor]) -> Result<Tensor> {
        let shapes: Vec<Vec<usize>> = operands.iter().map(|t| t.shape().to_vec()).collect();
        let fail = |reason: String| KilnError::InvalidArgument {
            op: "einsum",
            shape: shapes.first().cloned().unwrap_or_default(),
            reason: format!("{reason} (equation {equation:?}, operand shapes {shapes:?})"),
        };
        let spec = parse(equation, &shapes).map_err(fail)?;
        if let Some(first) = operands.first() {
            for t in operands {
                first.require_same_device("einsum", t)?;
            }
        }
        // Each label's size: equal where given, or 1 (broadcast).
        let mut size: std::collections::HashMap<Label, usize> = Default::default();
        for (labels, shape) in spec.inputs.iter().zip(&shapes) {
            for (&l, &d) in labels.iter().zip(shape) {
                let s = size.entry(l).or_insert(d);
                if *s == 1 {
                    *s = d;
                } else if d != 1 && d != *s {
                    return Err(fail(format!(
                        "subscript {} has size {d} in one place and {} in another",
                        name(l),
                        *s
                    )));
                }
            }
        }
        let mut terms: Vec<Term> = Vec::with_capacity(operands.len());
        for (t, labels) in operands.iter().zip(&spec.inputs) {
            terms.push(Term::diagonals((*t).clone(), labels.clone())?);
        }
        let mut acc: Option<Term> = None;
        for k in 0..terms.len() {
            // Labels still needed once operand `k` joins: the output's and those of the
            // operands after it.
            let mut needed: Vec<Label> = spec.output.clone();
            for t in &terms[k + 1..] {
                needed.extend(&t.labels);
            }
            let next = terms[k].clone();
            acc = Some(match acc {
                None => next.sum_except(&needed)?,
                Some(a) => {
                    let mut a_needed = needed.clone();
                    a_needed.extend(&next.labels);
                    let mut b_needed = needed.clone();
                    b_needed.extend(&a.labels);
                    let a = a.sum_except(&a_needed)?;
                    let b = next.sum_except(&b_needed)?;
                    a.contract(&b, &needed, &size)?
                }
            });
        }
        let Some(result) = acc else {
            return Err(fail("einsum needs at least one operand".into()));
        };
        result.into_order(&spec.output, &size)
    }
}

/// The parsed equation: each operand's labels (ellipsis expanded) and the output's.
struct Spec {
    inputs: Vec<Vec<Label>>,
    output: Vec<Label>,
}

fn name(l: Label) -> String {
    if l >= ELLIPSIS {
        format!("... (dimension {})", l - ELLIPSIS)
    } else {
        char::from_u32(l).map_or_else(|| "?".into(), String::from)
    }
}

/// One side's subscripts: the letters before an ellipsis, whether there is one, the letters
/// after it.
fn split_term(s: &str) -> std::result::Result<(Vec<Label>, bool, Vec<Label>), String> {
    let (head, tail, ell) = match s.find("...") {
        Some(i) => (&s[..i], &s[i + 3..], true),
        None => (s, "", false),
    };
    let letters = |p: &str| -> std::result::Result<Vec<Label>, String> {
        p.chars()
            .filter(|c| !c.is_whitespace())
            .map(|c| {
                if c.is_ascii_alphabetic() {
                    Ok(c as Label)
                } else {
                    Err(format!(
                        "{c:?} is not a subscript (letters a-z, A-Z and ...)"
                    ))
                }
            })
            .collect()
    };
    Ok((letters(head)?, ell, letters(tail)?))
}

fn parse(equation: &str, shapes: &[Vec<usize>]) -> std::result::Result<Spec, String> {
    let (lhs, rhs) = match equation.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (equation, None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != shapes.len() {
        return Err(format!(
            "the equation has {} operands, {} were given",
            terms.len(),
            shapes.len()
        ));
    }
    // The ellipsis covers the dimensions the letters leave; operands align them on the
    // right, as broadcasting does.
    let mut parts = vec![];
    let mut widest = 0;
    for (t, shape) in terms.iter().zip(shapes) {
        let (head, ell, tail) = split_term(t)?;
        let named = head.len() + tail.len();
        let covered = if ell {
            shape.len().checked_sub(named)
        } else {
            (shape.len() == named).then_some(0)
        };
        let Some(covered) = covered else {
            return Err(format!(
                "subscripts {t:?} do not match an operand of {} dimensions",
                shape.len()
            ));
        };
        widest = widest.max(covered);
        parts.push((head, covered, tail));
    }
    let inputs: Vec<Vec<Label>> = parts
        .into_iter()
        .map(|(head, covered, tail)| {
            let mut v = head;
            v.extend((widest - covered..widest).map(|i| ELLIPSIS + i as Label));
            v.extend(tail);
            v
        })
        .collect();
    let output = match rhs {
        Some(r) => {
            let (head, ell, tail) = split_term(r)?;
            let mut v = head;
            // Without an ellipsis in the output its dimensions are summed, as in PyTorch.
            if ell {
                v.extend((0..widest).map(|i| ELLIPSIS + i as Label));
            }
            v.extend(tail);
            let mut seen = std::collections::HashSet::new();
            for &l in &v {
                if !seen.insert(l) {
                    return Err(format!("output subscript {} appears twice", name(l)));
                }
                if !inputs.iter().any(|i| i.contains(&l)) {
                    return Err(format!(
                        "output subscript {} appears in no operand",
                        name(l)
                    ));
                }
            }
            v
        }
        None => {
            let mut count: std::collections::BTreeMap<Label, usize> = Default::default();
            for l in inputs.iter().flatten() {
                *count.entry(*l).or_default() += 1;
            }
            let mut v: Vec<Label> = (0..widest).map(|i| ELLIPSIS + i as Label).collect();
            // Letters used once, alphabetically (uppercase first, as character order).
            v.extend(
                count
                    .iter()
                    .filter(|&(&l, &n)| l < ELLIPSIS && n == 1)
                    .map(|(&l, _)| l),
            );
            v
        }
    };
    Ok(Spec { inputs, output })
}

/// A tensor whose dimensions carry labels (each at most once).
#[derive(Clone)]
struct Term {
    t: Tensor,
    labels: Vec<Label>,
}

impl Term {
    /// `t` with each repeated label taken along its diagonal ([`Tensor::diagonal`], which
    /// appends it last), so every label appears once.
    fn diagonals(mut t: Tensor, mut labels: Vec<Label>) -> Result<Term> {
        while let Some((i, j)) = first_repeat(&labels) {
            if t.shape()[i] != t.shape()[j] {
                return Err(KilnError::InvalidArgument {
                    op: "einsum",
                    shape: t.shape().to_vec(),
                    reason: format!(
                        "subscript {} is repeated over dimensions of sizes {} and {}",
                        name(labels[i]),
                        t.shape()[i],
                        t.shape()[j]
                    ),
                });
            }
            t = t.try_diagonal(0, i as isize, j as isize)?;
            let l = labels[i];
            labels = labels
                .iter()
                .enumerate()
                .filter(|&(d, _)| d != i && d != j)
                .map(|(_, &l)| l)
                .collect();
            labels.push(l);
        }
        Ok(Term { t, labels })
    }

    /// Sums out every label not in `keep`.
    fn sum_except(self, keep: &[Label]) -> Result<Term> {
        let drop: Vec<isize> = (0..self.labels.len())
            .filter(|&d| !keep.contains(&self.labels[d]))
            .map(|d| d as isize)
            .collect();
        if drop.is_empty() {
            return Ok(self);
        }
        let labels = self
            .labels
            .iter()
            .filter(|l| keep.contains(l))
            .copied()
            .collect();
        Ok(Term {
            t: self.t.try_sum(drop.as_slice())?,
            labels,
        })
    }

    /// `self · other` summed over the labels both have that `keep` does not; labels of
    /// either that `keep` lacks were summed out already.
    fn contract(
        &self,
        other: &Term,
        keep: &[Label],
        size: &std::collections::HashMap<Label, usize>,
    ) -> Result<Term> {
        let both = |l: &Label| other.labels.contains(l);
        let batch: Vec<Label> = self
            .labels
            .iter()
            .filter(|l| both(l) && keep.contains(l))
            .copied()
            .collect();
        let summed: Vec<Label> = self
            .labels
            .iter()
            .filter(|l| both(l) && !keep.contains(l))
            .copied()
            .collect();
        let left: Vec<Label> = self.labels.iter().filter(|l| !both(l)).copied().collect();
        let right: Vec<Label> = other
            .labels
            .iter()
            .filter(|l| !self.labels.contains(l))
            .copied()
            .collect();
        let sizes = |ls: &[Label]| -> Vec<usize> { ls.iter().map(|l| size[l]).collect() };
        let prod =
            |ls: &[Label]| -> isize { ls.iter().map(|l| size[l]).product::<usize>() as isize };
        let mut out_labels = batch.clone();
        out_labels.extend(&left);
        out_labels.extend(&right);
        let mut out_shape = sizes(&batch);
        out_shape.extend(sizes(&left));
        out_shape.extend(sizes(&right));
        if summed.is_empty() {
            // A broadcast product: each side gets size-1 dimensions for the other's labels.
            let a = self.arranged(&out_labels, size, false)?;
            let b = other.arranged(&out_labels, size, false)?;
            return Ok(Term {
                t: a.try_mul(&b)?,
                labels: out_labels,
            });
        }
        // [batch, left, summed] @ [batch, summed, right], each expanded to full sizes.
        let mut a_order = batch.clone();
        a_order.extend(&left);
        a_order.extend(&summed);
        let mut b_order = batch.clone();
        b_order.extend(&summed);
        b_order.extend(&right);
        let a = self.arranged(&a_order, size, true)?.try_reshape([
            prod(&batch),
            prod(&left),
            prod(&summed),
        ])?;
        let b = other.arranged(&b_order, size, true)?.try_reshape([
            prod(&batch),
            prod(&summed),
            prod(&right),
        ])?;
        let out: Vec<isize> = out_shape.iter().map(|&d| d as isize).collect();
        Ok(Term {
            t: a.try_matmul(&b)?.try_reshape(out.as_slice())?,
            labels: out_labels,
        })
    }

    /// The tensor permuted into `order` (labels it lacks become size-1 dimensions),
    /// expanded to every label's full size when `expand`.
    fn arranged(
        &self,
        order: &[Label],
        size: &std::collections::HashMap<Label, usize>,
        expand: bool,
    ) -> Result<Tensor> {
        let mine: Vec<Label> = order
            .iter()
            .filter(|l| self.labels.contains(l))
            .copied()
            .collect();
        let perm: Vec<isize> = mine
            .iter()
            .map(|l| self.labels.iter().position(|m| m == l).unwrap_or(0) as isize)
            .collect();
        let t = self.t.try_permute(perm.as_slice())?;
        let mut shape = Vec::with_capacity(order.len());
        let mut k = 0;
        for l in order {
            if self.labels.contains(l) {
                shape.push(t.shape()[k] as isize);
                k += 1;
            } else {
                shape.push(1);
            }
        }
        let t = t.try_reshape(shape.as_slice())?;
        if expand {
            let full: Vec<usize> = order.iter().map(|l| size[l]).collect();
            t.try_broadcast_to(full.as_slice())
        } else {
            Ok(t)
        }
    }

    /// The final term in the output's label order (summing what it drops), broadcast to
    /// every label's full size.
    fn into_order(
        self,
        output: &[Label],
        size: &std::collections::HashMap<Label, usize>,
    ) -> Result<Tensor> {
        let t = self.sum_except(output)?;
        let full: Vec<usize> = output.iter().map(|l| size[l]).collect();
        let arranged = t.arranged(output, size, false)?;
        if arranged.shape() == full.as_slice() {
            Ok(arranged)
        } else {
            arranged.try_broadcast_to(full.as_slice())
        }
    }
}

/// The first pair of positions holding the same label.
fn first_repeat(labels: &[Label]) -> Option<(usize, usize)> {
    for i in 0..labels.len() {
        for j in i + 1..labels.len() {
            if labels[i] == labels[j] {
                return Some((i, j));
            }
        }
    }
    None
}
