//! How a kernel's instructions are evaluated in passes over the reduce space. Shared by the
//! backends: the CPU runs each pass as a loop over runs of a row, the CUDA renderer as a
//! block-cooperative loop.
//!
//! A reduction can only start once the `Row` values its input needs are known, so
//! reductions are grouped into rounds: round `k` holds the reductions whose inputs depend on
//! `k - 1` earlier rounds (softmax: max in round 1, the sum of `exp(x - max)` in round 2).
//! Reductions of the same round share one pass. A final pass performs the `Elem` stores.

use super::{IrOp, Kernel, Level, ValueId};

/// One pass over the reduce space (or the final one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Reductions completed by this pass.
    pub reduces: Vec<ValueId>,
    /// `Elem` instructions evaluated at every position, in dependency order (constants
    /// excluded: backends read them as scalars).
    pub elem: Vec<ValueId>,
    /// `Elem` stores (final pass only).
    pub stores: Vec<ValueId>,
    /// `Row` instructions computable once this pass is done.
    pub row_after: Vec<ValueId>,
}

/// The pass structure of a kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelPasses {
    /// `Row` instructions that need no reduction (row loads and what they feed).
    pub row_first: Vec<ValueId>,
    /// Reduction rounds in order, then the final pass.
    pub passes: Vec<Pass>,
    /// `Row` stores, done last.
    pub row_stores: Vec<ValueId>,
}

impl KernelPasses {
    /// Number of reduction rounds.
    pub fn rounds(&self) -> usize {
        self.passes.len() - 1
    }
}

impl Kernel {
    /// Groups the instructions into passes (see the module documentation).
    pub fn passes(&self) -> KernelPasses {
        let n = self.ops.len();
        // dep[v]: reduction rounds that must finish before v can be computed.
        let mut dep = vec![0usize; n];
        for v in 0..n {
            let d = self.ops[v]
                .operands()
                .iter()
                .map(|&o| dep[o])
                .max()
                .unwrap_or(0);
            dep[v] = match self.ops[v].op {
                IrOp::Reduce { .. } => d + 1,
                _ => d,
            };
        }
        let rounds = (0..n)
            .filter(|&v| matches!(self.ops[v].op, IrOp::Reduce { .. }))
            .map(|v| dep[v])
            .max()
            .unwrap_or(0);
        let mut out = KernelPasses {
            row_first: vec![],
            passes: vec![Pass::default(); rounds + 1],
            row_stores: vec![],
        };
        for (v, (ins, &d)) in self.ops.iter().zip(&dep).enumerate() {
            match (&ins.op, ins.level) {
                (IrOp::Store { .. }, Level::Row) => out.row_stores.push(v),
                (IrOp::Store { .. }, Level::Elem) => out.passes[rounds].stores.push(v),
                (IrOp::Reduce { .. }, _) => out.passes[d - 1].reduces.push(v),
                (IrOp::Const(_) | IrOp::Param { .. }, _) => {}
                (_, Level::Row) if d == 0 => out.row_first.push(v),
                (_, Level::Row) => out.passes[d - 1].row_after.push(v),
                _ => {}
            }
        }
        for pass in out.passes.iter_mut() {
            let mut need = vec![false; n];
            let mut stack: Vec<ValueId> = pass
                .reduces
                .iter()
                .chain(&pass.stores)
                .flat_map(|&r| self.ops[r].operands())
                .collect();
            while let Some(v) = stack.pop() {
                let ins = &self.ops[v];
                if ins.level != Level::Elem
                    || need[v]
                    || matches!(ins.op, IrOp::Const(_) | IrOp::Param { .. })
                {
                    continue;
                }
                need[v] = true;
                stack.extend(ins.operands());
            }
            pass.elem = (0..n).filter(|&v| need[v]).collect();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::kernel::Step;
    use crate::plan::RealizeOptions;
    use crate::{DType, Tensor};

    #[test]
    fn softmax_has_two_rounds_and_a_storing_pass() {
        let x = Tensor::try_rand([4, 8], 1, DType::F32).unwrap();
        let p = x.softmax(-1).plan(&RealizeOptions::default()).unwrap();
        let Step::Kernel(k) = &p.program.steps[0] else {
            panic!()
        };
        let passes = k.kernel.passes();
        assert_eq!(passes.rounds(), 2);
        assert_eq!(passes.passes[0].reduces.len(), 1);
        assert_eq!(passes.passes[1].reduces.len(), 1);
        assert_eq!(passes.passes[2].stores.len(), 1);
        assert!(passes.row_stores.is_empty());
    }

    #[test]
    fn independent_reductions_share_a_pass() {
        let x = Tensor::try_rand([4, 8], 1, DType::F32).unwrap();
        let t = x.sum(1) + x.max(1);
        let p = t.plan(&RealizeOptions::default()).unwrap();
        let Step::Kernel(k) = &p.program.steps[0] else {
            panic!()
        };
        let passes = k.kernel.passes();
        assert_eq!(passes.rounds(), 1);
        assert_eq!(passes.passes[0].reduces.len(), 2);
        assert_eq!(passes.row_stores.len(), 1);
    }
}
