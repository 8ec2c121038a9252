//! The lazy graph: a petgraph DAG of [`Node`]s, addressed through versioned slotmap keys.
//!
//! Edges run from an input to its consumer; the edge weight is the operand position. A node
//! stays alive while a [`crate::Tensor`] handle points at it or a live node consumes it; when
//! both counts reach zero it is removed, and its inputs are checked in turn. After
//! `realize()`, a node becomes an [`Op::Buffer`] leaf and loses its input edges, so a loop that
//! builds and realizes expressions keeps the graph bounded.

pub use crate::ops::{BinaryOp, Generator, Op, ReduceOp, UnaryOp};

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{KilnError, Result};
use crate::memory::Buffer;
use petgraph::Direction;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use slotmap::{SlotMap, new_key_type};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

new_key_type! {
    /// A stable, versioned handle to a graph node (a stale key never aliases a new node).
    pub struct NodeKey;
}

/// One recorded op with its result's metadata.
#[derive(Debug)]
pub struct Node {
    /// This node's own key.
    pub key: NodeKey,
    /// The recorded op; its operands are the node's input edges, in edge-weight order.
    pub op: Op,
    /// Shape of the result.
    pub shape: Vec<usize>,
    /// Dtype of the result.
    pub dtype: DType,
    /// Device the result lives on.
    pub device: Device,
    /// The data, once realized (`op == Op::Buffer`); for an `Assign`, the buffer it writes.
    pub buffer: Option<Arc<Buffer>>,
    /// The buffer's version when this node took it: reading the node once an in-place
    /// write bumped the buffer past it is refused (the value is gone).
    pub version: u64,
    /// Gradient tracking, when the node requires grad.
    pub autograd: Option<Box<Autograd>>,
    /// Where a buffer node's data came from (for dumps).
    pub origin: Origin,
    handles: usize,
}

impl Node {
    /// True for a value without elements that is computed from operands (not realized, not
    /// a generator, not an in-place write): the planner computes nothing it reads (its
    /// sweep stops here) and plans it as a constant ([`Graph::sweep`]). A layer norm
    /// without elements then needs no row statistics, however many rows it has.
    pub fn is_empty_computation(&self) -> bool {
        self.shape.contains(&0) && !matches!(self.op, Op::Buffer | Op::Generate(_) | Op::Assign)
    }

    /// The op the planner plans for this node: its own, or a constant for an empty
    /// computation (whose operands the planner's sweep does not visit).
    pub fn planned_op(&self) -> std::borrow::Cow<'_, Op> {
        if self.is_empty_computation() {
            let zero = crate::dtype::Scalar::Int(0).cast(self.dtype);
            std::borrow::Cow::Owned(Op::Generate(crate::ops::Generator::Full(zero)))
        } else {
            std::borrow::Cow::Borrowed(&self.op)
        }
    }
}

/// Where a node's value comes from, as dumps tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Computed by its op when realized.
    Recorded,
    /// Data handed in by the program (`from_vec`, a file load).
    Data,
    /// The result of an earlier realize; holds what the node computed (`"add"`, `"matmul"`).
    Realized(String),
}

/// How a value that requires grad was computed.
#[derive(Debug, Clone)]
pub enum GradFn {
    /// The node's own op, over its input edges (kept until a backward pass used them).
    Op(Op),
    /// A composite recorded without history (cross entropy, say), whose backward is one
    /// rule over its own inputs; the graph holds a handle to each input until the history
    /// is released. The rule's type is the autograd layer's.
    Custom {
        /// The backward rule, of the autograd layer's type.
        rule: Arc<dyn std::any::Any + Send + Sync>,
        /// The composite's inputs, in the rule's order.
        inputs: Vec<NodeKey>,
    },
}

/// A node's gradient-tracking state.
#[derive(Debug, Clone, Default)]
pub struct Autograd {
    /// How the value was computed, kept until a backward pass consumes it; `None` for a
    /// leaf.
    pub grad_fn: Option<GradFn>,
    /// The accumulated gradient of a leaf (a node key the graph holds a handle to).
    pub grad: Option<NodeKey>,
    /// Gradients that reach this leaf accumulate into that node's `grad` instead (the old
    /// value of a parameter updated in place).
    pub accumulate_into: Option<NodeKey>,
    /// A backward pass used (and dropped) this node's history.
    pub released: bool,
}

impl Autograd {
    /// True for a leaf: a value that was not computed from tensors requiring grad.
    pub fn is_leaf(&self) -> bool {
        self.grad_fn.is_none() && !self.released
    }
}

impl Node {
    /// Number of live tensor handles pointing at this node.
    pub fn handles(&self) -> usize {
        self.handles
    }
}

/// The graph store. One process-wide instance lives behind `with_graph` (crate-private) and
/// [`read_graph`].
#[derive(Default)]
pub struct Graph {
    dag: StableDiGraph<Node, usize>,
    keys: SlotMap<NodeKey, NodeIndex>,
    marks: std::cell::RefCell<Marks>,
    /// In-place updates recorded so far ([`Graph::inplace_epoch`]).
    inplace_epoch: u64,
    /// Nodes a running realize will install its results on ([`Graph::mark_installing`]),
    /// once per realize that will.
    installing: Vec<NodeKey>,
}

impl Graph {
    /// Records a node with one handle (the tensor that is about to hold it).
    pub fn add_node(
        &mut self,
        op: Op,
        inputs: impl ExactSizeIterator<Item = NodeKey>,
        shape: Vec<usize>,
        dtype: DType,
        device: Device,
    ) -> Result<NodeKey> {
        // Most ops have at most four inputs: their indices stay on the stack.
        let mut few = [NodeIndex::end(); 4];
        let many: Vec<NodeIndex>;
        let n = inputs.len();
        let input_idx: &[NodeIndex] = if n <= few.len() {
            for (slot, k) in few.iter_mut().zip(inputs) {
                *slot = self.index(k)?;
            }
            &few[..n]
        } else {
            many = inputs.map(|k| self.index(k)).collect::<Result<_>>()?;
            &many
        };
        Ok(self.insert(op, input_idx, shape, dtype, device))
    }

    fn insert(
        &mut self,
        op: Op,
        input_idx: &[NodeIndex],
        shape: Vec<usize>,
        dtype: DType,
        device: Device,
    ) -> NodeKey {
        let tracked = grad_enabled()
            && dtype.is_float()
            && op.is_differentiable()
            && input_idx.iter().any(|&i| self.dag[i].autograd.is_some());
        let autograd = tracked.then(|| {
            Box::new(Autograd {
                grad_fn: Some(GradFn::Op(op.clone())),
                ..Default::default()
            })
        });
        let key = self.keys.insert(NodeIndex::end());
        let idx = self.dag.add_node(Node {
            key,
            op,
            shape,
            dtype,
            device,
            buffer: None,
            origin: Origin::Recorded,
            version: 0,
            autograd,
            handles: 1,
        });
        self.keys[key] = idx;
        for (pos, &i) in input_idx.iter().enumerate() {
            self.dag.add_edge(i, idx, pos);
        }
        key
    }

    /// Records a realized leaf holding `buffer`.
    pub fn add_buffer(
        &mut self,
        buffer: Arc<Buffer>,
        shape: Vec<usize>,
        dtype: DType,
        device: Device,
        origin: Origin,
    ) -> NodeKey {
        let key = self.insert(Op::Buffer, &[], shape, dtype, device);
        let n = &mut self.dag[self.keys[key]];
        n.version = buffer.version();
        n.buffer = Some(buffer);
        n.origin = origin;
        key
    }

    /// A second realized node holding `of`'s buffer with `of`'s value: the same version as
    /// `of`, so a value that an in-place write has already replaced stays replaced under
    /// the new node too. `None` unless `of` is realized.
    pub fn add_buffer_alias(&mut self, of: NodeKey) -> Result<Option<NodeKey>> {
        let n = self.node(of)?;
        let (Op::Buffer, Some(buffer)) = (&n.op, n.buffer.clone()) else {
            return Ok(None);
        };
        let (shape, dtype, device, origin, version) = (
            n.shape.clone(),
            n.dtype,
            n.device,
            n.origin.clone(),
            n.version,
        );
        let key = self.add_buffer(buffer, shape, dtype, device, origin);
        self.dag[self.keys[key]].version = version;
        Ok(Some(key))
    }

    fn index(&self, key: NodeKey) -> Result<NodeIndex> {
        self.keys
            .get(key)
            .copied()
            .ok_or_else(|| KilnError::internal("tensor handle refers to a dropped graph node"))
    }

    /// The node behind a key.
    pub fn node(&self, key: NodeKey) -> Result<&Node> {
        Ok(&self.dag[self.index(key)?])
    }

    /// Inputs of a node in operand order.
    pub fn inputs(&self, key: NodeKey) -> Result<Vec<NodeKey>> {
        let idx = self.index(key)?;
        let mut edges: Vec<(usize, NodeKey)> = self
            .dag
            .edges_directed(idx, Direction::Incoming)
            .map(|e| (*e.weight(), self.dag[e.source()].key))
            .collect();
        edges.sort_by_key(|e| e.0);
        Ok(edges.into_iter().map(|e| e.1).collect())
    }

    /// Number of distinct consumers (nodes reading this one).
    pub fn consumer_count(&self, key: NodeKey) -> Result<usize> {
        let idx = self.index(key)?;
        Ok(self
            .dag
            .neighbors_directed(idx, Direction::Outgoing)
            .count())
    }

    /// Number of live nodes (bounded in realize loops; tests check it).
    pub fn len(&self) -> usize {
        self.dag.node_count()
    }

    /// Every live node, in no particular order.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.dag.node_weights()
    }

    /// True when no node is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A new handle to `key` (a tensor clone).
    pub fn retain(&mut self, key: NodeKey) {
        if let Some(&idx) = self.keys.get(key) {
            self.dag[idx].handles += 1;
        }
    }

    /// Drops one handle of `key`, removing whatever becomes unreachable.
    pub fn release(&mut self, key: NodeKey) {
        if let Some(&idx) = self.keys.get(key) {
            let n = &mut self.dag[idx];
            n.handles = n.handles.saturating_sub(1);
            self.prune_from(idx);
        }
    }

    /// Turns a node into a realized leaf: it keeps its key, shape and dtype, holds `buffer`,
    /// and its input edges go (pruning inputs nobody else needs) — unless the node still has
    /// a `grad_fn`, in which case they stay until a backward pass ran: a backward pass needs
    /// an op's inputs, and a composite's edge to the forward ops it recorded lets the
    /// reference evaluator's gradients differentiate through them.
    pub fn set_realized(&mut self, key: NodeKey, buffer: Arc<Buffer>) -> Result<()> {
        let idx = self.index(key)?;
        let n = &mut self.dag[idx];
        if n.op != Op::Buffer {
            n.origin = Origin::Realized(n.op.name());
        }
        n.op = Op::Buffer;
        n.version = buffer.version();
        n.buffer = Some(buffer);
        let keeps_history = n.autograd.as_ref().is_some_and(|a| a.grad_fn.is_some());
        if !keeps_history {
            self.cut_inputs(idx);
        }
        Ok(())
    }

    /// Removes a node's input edges and prunes inputs nobody else needs.
    fn cut_inputs(&mut self, idx: NodeIndex) {
        let inputs: Vec<NodeIndex> = self
            .dag
            .neighbors_directed(idx, Direction::Incoming)
            .collect();
        let edges: Vec<_> = self
            .dag
            .edges_directed(idx, Direction::Incoming)
            .map(|e| e.id())
            .collect();
        for e in edges {
            self.dag.remove_edge(e);
        }
        for i in inputs {
            self.prune_from(i);
        }
    }

    /// The other realized nodes that hold `value`'s buffer at the same version: the same
    /// value under another tensor (`x.detach()`, a realized reshape of `x`). An in-place
    /// write to the buffer overwrites their value too. Empty unless `value` is realized.
    pub fn buffer_aliases(&self, value: NodeKey) -> Result<Vec<NodeKey>> {
        let n = self.node(value)?;
        let (Op::Buffer, Some(b)) = (&n.op, &n.buffer) else {
            return Ok(vec![]);
        };
        // Each node holding the buffer holds one reference; the value and the in-place
        // write's node hold two. Only more can mean an alias, so the common case skips the
        // scan. A value already overwritten has no readers left to save (they fail).
        if Arc::strong_count(b) <= 2 || b.len_bytes() == 0 || b.version() != n.version {
            return Ok(vec![]);
        }
        Ok(self
            .dag
            .node_weights()
            .filter(|a| {
                a.key != value
                    && a.op == Op::Buffer
                    && a.version == n.version
                    && a.buffer.as_ref().is_some_and(|ab| Arc::ptr_eq(ab, b))
            })
            .map(|a| a.key)
            .collect())
    }

    /// The unrealized nodes with live tensor handles that read `value` (directly or through
    /// other unrealized nodes), not counting the way through `except`.
    pub fn live_readers(&self, value: NodeKey, except: NodeKey) -> Result<Vec<NodeKey>> {
        let (start, skip) = (self.index(value)?, self.index(except)?);
        let mut out = vec![];
        // Indexed by node index (a bitmap, not a hash set: an optimizer step asks this for
        // every parameter over the whole pending forward and backward graph).
        let mut seen = vec![false; petgraph::visit::NodeIndexable::node_bound(&self.dag)];
        let mut stack: Vec<NodeIndex> = self
            .dag
            .neighbors_directed(start, Direction::Outgoing)
            .filter(|&c| c != skip)
            .collect();
        while let Some(i) = stack.pop() {
            // `except` (the write) is reached again through its own value, which reads
            // `value`: what reads the write reads the new value, not this one.
            if i == skip || std::mem::replace(&mut seen[i.index()], true) {
                continue;
            }
            let n = &self.dag[i];
            if matches!(n.op, Op::Buffer) {
                continue;
            }
            if n.handles > 0 {
                out.push(n.key);
            }
            stack.extend(self.dag.neighbors_directed(i, Direction::Outgoing));
        }
        Ok(out)
    }

    /// [`Graph::live_readers`] for several writes at once, in one walk: for each
    /// `(starts, except)`, the unrealized nodes with live tensor handles that read any of
    /// `starts` (directly or through other unrealized nodes), not counting the way through
    /// `except`. Each list is in an order that depends only on the graph.
    ///
    /// An optimizer step overwrites every parameter, and the graph pending behind it (the
    /// forward and backward pass) reads them all: one walk per write visited that graph once
    /// per parameter. Here one depth-first walk orders every node reachable from any start,
    /// and a second pass carries, in that order, the set of writes whose old value reaches
    /// each node (a bitset, one bit per write).
    pub fn live_readers_of(&self, writes: &[(Vec<NodeKey>, NodeKey)]) -> Result<Vec<Vec<NodeKey>>> {
        let bound = petgraph::visit::NodeIndexable::node_bound(&self.dag);
        let words = writes.len().div_ceil(64).max(1);
        // Per node: its position in `post` plus one (0: not reached).
        let mut pos = vec![0u32; bound];
        let mut seeds: Vec<(NodeIndex, usize)> = vec![];
        let mut is_start = vec![false; bound];
        // Per node: the write it is the node of, plus one (0: none).
        let mut write_of = vec![0u32; bound];
        for (w, (starts, except)) in writes.iter().enumerate() {
            for &s in starts {
                let i = self.index(s)?;
                seeds.push((i, w));
                is_start[i.index()] = true;
            }
            write_of[self.index(*except)?.index()] = w as u32 + 1;
        }
        // Reverse post-order of an iterative depth-first walk from every start, expanding
        // starts and unrealized nodes (a realized node reads nothing pending): a topological
        // order of the reached nodes.
        let mut post: Vec<NodeIndex> = vec![];
        let mut state = vec![0u8; bound]; // 0 unseen, 1 on the stack, 2 done
        let mut stack: Vec<(NodeIndex, bool)> = vec![];
        for &(s, _) in &seeds {
            if state[s.index()] != 0 {
                continue;
            }
            stack.push((s, true));
            while let Some(&mut (i, ref mut first)) = stack.last_mut() {
                if *first && state[i.index()] != 0 {
                    // Pushed again by another parent before it was walked.
                    stack.pop();
                } else if *first {
                    *first = false;
                    state[i.index()] = 1;
                    let expand = is_start[i.index()] || !matches!(self.dag[i].op, Op::Buffer);
                    if expand {
                        for c in self.dag.neighbors_directed(i, Direction::Outgoing) {
                            if state[c.index()] == 0 {
                                stack.push((c, true));
                            }
                        }
                    }
                } else {
                    stack.pop();
                    if state[i.index()] == 1 {
                        state[i.index()] = 2;
                        post.push(i);
                    }
                }
            }
        }
        post.reverse();
        for (p, &i) in post.iter().enumerate() {
            pos[i.index()] = p as u32 + 1;
        }
        // `reach[p]`: the writes whose old value node `post[p]` reads (then `live` if it has
        // handles) and passes on; `seed[p]`: the writes it starts.
        let mut reach = vec![0u64; post.len() * words];
        let mut seed = vec![0u64; post.len() * words];
        let set = |bits: &mut [u64], p: usize, w: usize| bits[p * words + w / 64] |= 1 << (w % 64);
        for &(i, w) in &seeds {
            set(&mut seed, pos[i.index()] as usize - 1, w);
        }
        let mut out = vec![vec![]; writes.len()];
        let mut carry = vec![0u64; words];
        for (p, &i) in post.iter().enumerate() {
            let row = p * words..(p + 1) * words;
            // A write's own node does not read its old value on the write's behalf: what
            // reads the write reads the new value.
            if let Some(w) = (write_of[i.index()] as usize).checked_sub(1) {
                reach[p * words + w / 64] &= !(1 << (w % 64));
            }
            if matches!(self.dag[i].op, Op::Buffer) {
                reach[row.clone()].fill(0);
            } else if self.dag[i].handles > 0 {
                for (wi, &word) in reach[row.clone()].iter().enumerate() {
                    let mut bits = word;
                    while bits != 0 {
                        let b = bits.trailing_zeros() as usize;
                        out[wi * 64 + b].push(self.dag[i].key);
                        bits &= bits - 1;
                    }
                }
            }
            for (c, (r, s)) in carry
                .iter_mut()
                .zip(reach[row.clone()].iter().zip(&seed[row]))
            {
                *c = r | s;
            }
            if carry.iter().all(|&c| c == 0) {
                continue;
            }
            for c in self.dag.neighbors_directed(i, Direction::Outgoing) {
                let q = pos[c.index()] as usize;
                if q == 0 {
                    continue;
                }
                for (dst, &b) in reach[(q - 1) * words..q * words].iter_mut().zip(&carry) {
                    *dst |= b;
                }
            }
        }
        Ok(out)
    }

    /// Mutable access to a node's gradient-tracking state.
    pub fn autograd_mut(&mut self, key: NodeKey) -> Result<&mut Option<Box<Autograd>>> {
        let idx = self.index(key)?;
        Ok(&mut self.dag[idx].autograd)
    }

    /// Sets a leaf's accumulated gradient (`None` clears it), taking a handle to `grad` and
    /// dropping the one held on the previous gradient.
    pub fn set_grad(&mut self, key: NodeKey, grad: Option<NodeKey>) -> Result<()> {
        let idx = self.index(key)?;
        if let Some(g) = grad {
            self.retain(g);
        }
        let old = match &mut self.dag[idx].autograd {
            Some(a) => std::mem::replace(&mut a.grad, grad),
            None => {
                if let Some(g) = grad {
                    self.release(g);
                }
                return Err(KilnError::internal("set_grad on a node without autograd"));
            }
        };
        if let Some(o) = old {
            self.release(o);
        }
        Ok(())
    }

    /// Forgets how a node was computed (after a backward pass used it): drops its
    /// `grad_fn` and, for a realized node, the input edges that only history kept.
    pub fn release_history(&mut self, key: NodeKey) -> Result<()> {
        let idx = self.index(key)?;
        let n = &mut self.dag[idx];
        let had = match &mut n.autograd {
            Some(a) => {
                a.released = true;
                a.grad_fn.take()
            }
            None => None,
        };
        let realized = n.op == Op::Buffer;
        if let Some(GradFn::Custom { inputs, .. }) = &had {
            for &k in inputs {
                self.release(k);
            }
        }
        if had.is_some() && realized {
            self.cut_inputs(idx);
        }
        Ok(())
    }

    /// Gives `key` a custom backward rule over `inputs` (taking a handle to each).
    pub fn set_custom_grad(
        &mut self,
        key: NodeKey,
        rule: Arc<dyn std::any::Any + Send + Sync>,
        inputs: Vec<NodeKey>,
    ) -> Result<()> {
        let idx = self.index(key)?;
        for &k in &inputs {
            self.index(k)?;
            self.retain(k);
        }
        self.dag[idx].autograd = Some(Box::new(Autograd {
            grad_fn: Some(GradFn::Custom { rule, inputs }),
            ..Default::default()
        }));
        Ok(())
    }

    /// How many in-place updates have been recorded ([`Graph::begin_inplace`] calls): a
    /// value recorded for an update is stale if this changed before the update is.
    pub fn inplace_epoch(&self) -> u64 {
        self.inplace_epoch
    }

    /// Marks `keys` as nodes a realize now running will install its results on. An
    /// in-place update of one of them must wait until it has ([`Graph::is_installing`]):
    /// the update moves the node's value to a new node, and the result would land on the
    /// update instead.
    pub fn mark_installing(&mut self, keys: &[NodeKey]) {
        self.installing.extend_from_slice(keys);
    }

    /// Ends marks made by [`Graph::mark_installing`] with the same keys.
    pub fn unmark_installing(&mut self, keys: &[NodeKey]) {
        for k in keys {
            if let Some(i) = self.installing.iter().position(|m| m == k) {
                self.installing.swap_remove(i);
            }
        }
    }

    /// Whether a running realize will install a result on `key`.
    pub fn is_installing(&self, key: NodeKey) -> bool {
        self.installing.contains(&key)
    }

    /// First half of an in-place update of `key`: moves the node's current value into a
    /// new node (its op, inputs, buffer and version), points every existing consumer at
    /// that new node — so computations recorded before the update keep reading the old
    /// value — and returns it with one handle. `key` keeps its handles and gradient slot;
    /// [`Graph::finish_inplace`] gives it its new value.
    pub fn begin_inplace(&mut self, key: NodeKey) -> Result<NodeKey> {
        let idx = self.index(key)?;
        self.inplace_epoch += 1;
        let (op, shape, dtype, device, buffer, version, leaf_grad) = {
            let n = &self.dag[idx];
            let leaf = n.autograd.as_ref().is_some_and(|a| a.is_leaf());
            (
                n.op.clone(),
                n.shape.clone(),
                n.dtype,
                n.device,
                n.buffer.clone(),
                n.version,
                leaf,
            )
        };
        let old = self.insert(op, &[], shape, dtype, device);
        let old_idx = self.keys[old];
        {
            let o = &mut self.dag[old_idx];
            o.buffer = buffer;
            o.version = version;
            // The old value's gradient still belongs to the parameter.
            o.autograd = leaf_grad.then(|| {
                Box::new(Autograd {
                    accumulate_into: Some(key),
                    ..Default::default()
                })
            });
        }
        if let Some(a) = self.dag[idx].autograd.as_mut()
            && a.grad_fn.is_some()
        {
            let grad_fn = a.grad_fn.take();
            self.dag[old_idx].autograd = Some(Box::new(Autograd {
                grad_fn,
                ..Default::default()
            }));
        }
        let moves: Vec<_> = self
            .dag
            .edges_directed(idx, Direction::Outgoing)
            .map(|e| (e.id(), e.target(), *e.weight(), true))
            .chain(
                self.dag
                    .edges_directed(idx, Direction::Incoming)
                    .map(|e| (e.id(), e.source(), *e.weight(), false)),
            )
            .collect();
        for (edge, other, pos, outgoing) in moves {
            self.dag.remove_edge(edge);
            if outgoing {
                self.dag.add_edge(old_idx, other, pos);
            } else {
                self.dag.add_edge(other, old_idx, pos);
            }
        }
        Ok(old)
    }

    /// Second half of an in-place update: `key` becomes `value`. If the old value had a
    /// buffer (or was itself an in-place write), `key` becomes an `Assign` that writes
    /// `value` into that same buffer when realized; otherwise `key` is simply `value`.
    pub fn finish_inplace(&mut self, key: NodeKey, old: NodeKey, value: NodeKey) -> Result<()> {
        let (idx, old_idx, value_idx) = (self.index(key)?, self.index(old)?, self.index(value)?);
        let dest = self.dag[old_idx].buffer.clone();
        let n = &mut self.dag[idx];
        if let Some(b) = dest {
            n.op = Op::Assign;
            n.buffer = Some(b);
            self.dag.add_edge(old_idx, idx, 0);
            self.dag.add_edge(value_idx, idx, 1);
        } else {
            n.op = Op::Movement(crate::shape::Movement::Reshape(n.shape.clone()));
            n.buffer = None;
            self.dag.add_edge(value_idx, idx, 0);
        }
        Ok(())
    }

    /// Whether pruning stops at `idx`: the node is gone, or a handle or a consumer holds it.
    fn kept(&self, idx: NodeIndex) -> bool {
        self.dag.node_weight(idx).is_none_or(|n| {
            n.handles > 0
                || self
                    .dag
                    .neighbors_directed(idx, Direction::Outgoing)
                    .next()
                    .is_some()
        })
    }

    fn prune_from(&mut self, start: NodeIndex) {
        // The common case (a handle dropped while the node is still read or held) needs no
        // stack.
        if self.kept(start) {
            return;
        }
        let mut stack = vec![start];
        while let Some(idx) = stack.pop() {
            if self.kept(idx) {
                continue;
            }
            // The inputs are visited after the node is gone (one consumer fewer each).
            stack.extend(self.dag.neighbors_directed(idx, Direction::Incoming));
            if let Some(node) = self.dag.remove_node(idx) {
                self.keys.remove(node.key);
                // The graph's handles on a gradient and on a custom rule's inputs go with
                // the node.
                let mut held = vec![];
                if let Some(a) = node.autograd {
                    held.extend(a.grad);
                    if let Some(GradFn::Custom { inputs, .. }) = a.grad_fn {
                        held.extend(inputs);
                    }
                }
                for g in held {
                    if let Some(&gi) = self.keys.get(g) {
                        let gn = &mut self.dag[gi];
                        gn.handles = gn.handles.saturating_sub(1);
                        stack.push(gi);
                    }
                }
            }
        }
    }

    /// Every not-yet-realized node that `targets` depend on, inputs before consumers.
    /// Realized nodes reached on the way are included as leaves.
    pub fn lazy_subgraph(&self, targets: &[NodeKey]) -> Result<Vec<NodeKey>> {
        Ok(self.sweep_all(targets, false)?.order)
    }

    /// One depth-first sweep (iterative: deep chains need no call stack) over what
    /// `targets` depend on: the nodes in post-order (operands in order, inputs before
    /// consumers) and each node's operands as positions in that order. Realized nodes are
    /// leaves, and so are values without elements ([`Node::is_empty_computation`]): nothing
    /// they read is needed, so the planner sees no operands for them. The order is a
    /// function of the graph's structure alone.
    pub fn sweep(&self, targets: &[NodeKey]) -> Result<Sweep> {
        self.sweep_all(targets, true)
    }

    /// [`Graph::sweep`], stopping at values without elements only when `cut_empty`.
    fn sweep_all(&self, targets: &[NodeKey], cut_empty: bool) -> Result<Sweep> {
        let leaf = |n: &Node| n.op == Op::Buffer || (cut_empty && n.is_empty_computation());
        let mut marks = self.marks.borrow_mut();
        marks.stamp = marks.stamp.wrapping_add(1);
        if marks.stamp == 0 {
            marks.pos.iter_mut().for_each(|m| *m = (0, 0));
            marks.stamp = 1;
        }
        let stamp = marks.stamp;
        let bound = petgraph::visit::NodeIndexable::node_bound(&self.dag);
        if marks.pos.len() < bound {
            marks.pos.resize(bound, (0, 0));
        }
        // marks.pos[i] = (stamp, 0) while on the stack, (stamp, position + 1) once placed.
        // The scratch vectors keep their capacity between sweeps, and the result starts
        // with the last sweep's sizes, up to 4096 entries (a repeated realize sweeps the
        // same graph; a huge one before a small one should not make it allocate much).
        let (nodes, operands) = (marks.sizes.0.min(1 << 12), marks.sizes.1.min(1 << 12));
        let mut out = Sweep {
            order: Vec::with_capacity(nodes),
            operands: Vec::with_capacity(operands),
            operand_end: Vec::with_capacity(nodes),
        };
        let mut stack = std::mem::take(&mut marks.stack);
        let mut ins = std::mem::take(&mut marks.ins);
        stack.clear();
        for &t in targets {
            let root = self.index(t)?;
            stack.push((root, false));
            while let Some((idx, expanded)) = stack.pop() {
                let i = idx.index();
                if expanded {
                    let node = &self.dag[idx];
                    ins.clear();
                    if !leaf(node) {
                        ins.extend(
                            self.dag
                                .edges_directed(idx, Direction::Incoming)
                                .map(|e| (*e.weight(), e.source())),
                        );
                        ins.sort_unstable_by_key(|e| e.0);
                    }
                    for &(_, src) in &ins {
                        let (s, p) = marks.pos[src.index()];
                        if s != stamp || p == 0 {
                            return Err(KilnError::internal("sweep: operand not placed first"));
                        }
                        out.operands.push(p as u32 - 1);
                    }
                    out.order.push(node.key);
                    out.operand_end.push(out.operands.len() as u32);
                    marks.pos[i] = (stamp, out.order.len());
                    continue;
                }
                if marks.pos[i].0 == stamp {
                    continue;
                }
                marks.pos[i] = (stamp, 0);
                stack.push((idx, true));
                if !leaf(&self.dag[idx]) {
                    ins.clear();
                    ins.extend(
                        self.dag
                            .edges_directed(idx, Direction::Incoming)
                            .map(|e| (*e.weight(), e.source())),
                    );
                    ins.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
                    for &(_, src) in &ins {
                        if marks.pos[src.index()].0 != stamp {
                            stack.push((src, false));
                        }
                    }
                }
            }
        }
        marks.sizes = (out.order.len(), out.operands.len());
        marks.stack = stack;
        marks.ins = ins;
        Ok(out)
    }
}

/// The result of [`Graph::sweep`].
#[derive(Debug, Clone, Default)]
pub struct Sweep {
    /// Nodes, inputs before consumers.
    pub order: Vec<NodeKey>,
    /// Operands of every node as positions in `order`, concatenated.
    pub operands: Vec<u32>,
    /// End of node `i`'s operands in `operands` (they start at entry `i - 1`'s end).
    pub operand_end: Vec<u32>,
}

impl Sweep {
    /// The operands of the node at position `i`, as positions.
    pub fn operands_of(&self, i: usize) -> &[u32] {
        let start = if i == 0 {
            0
        } else {
            self.operand_end[i - 1] as usize
        };
        &self.operands[start..self.operand_end[i] as usize]
    }
}

/// Scratch marks for [`Graph::sweep`], stamped so they need no clearing between sweeps.
#[derive(Debug, Default)]
struct Marks {
    stamp: usize,
    pos: Vec<(usize, usize)>,
    /// The depth-first stack and one node's operands, kept for their capacity.
    stack: Vec<(NodeIndex, bool)>,
    ins: Vec<(usize, NodeIndex)>,
    /// The last sweep's node and operand counts.
    sizes: (usize, usize),
}

thread_local! {
    static GRAD_ENABLED: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
}

/// Whether ops recorded on this thread now track gradients.
pub fn grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Turns gradient tracking on this thread on or off; returns the previous setting.
pub fn set_grad_enabled(on: bool) -> bool {
    GRAD_ENABLED.with(|g| g.replace(on))
}

static GRAPH: LazyLock<Mutex<Graph>> = LazyLock::new(Default::default);
static PENDING_RELEASES: Mutex<Vec<NodeKey>> = Mutex::new(Vec::new());

fn lock_graph() -> MutexGuard<'static, Graph> {
    // A panic while the lock was held cannot leave the graph half-edited in a way that
    // matters more than refusing all further work, so poisoning is ignored.
    let mut g = GRAPH.lock().unwrap_or_else(|e| e.into_inner());
    drain_pending(&mut g);
    g
}

/// Set while `PENDING_RELEASES` may be non-empty (so the common case takes no second lock).
static HAS_PENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn drain_pending(g: &mut Graph) {
    use std::sync::atomic::Ordering;
    if !HAS_PENDING.swap(false, Ordering::Acquire) {
        return;
    }
    let pending: Vec<NodeKey> =
        std::mem::take(&mut *PENDING_RELEASES.lock().unwrap_or_else(|e| e.into_inner()));
    for k in pending {
        g.release(k);
    }
}

/// Runs `f` with the process-wide graph locked. Crate-private: installing buffers, handle
/// counts and in-place bookkeeping are kiln's to change (a node given a buffer of the wrong
/// size or device, or with stale bytes in a bool tensor, would reach the kernels).
pub(crate) fn with_graph<R>(f: impl FnOnce(&mut Graph) -> R) -> R {
    let mut g = lock_graph();
    f(&mut g)
}

/// Runs `f` with the process-wide graph locked, to read it (node shapes, buffers,
/// operands, the pending subgraph).
pub fn read_graph<R>(f: impl FnOnce(&Graph) -> R) -> R {
    let g = lock_graph();
    f(&g)
}

/// Drops a tensor handle. Never blocks: if the graph is busy (held by another thread, or by
/// this one inside `with_graph`), the release is queued and applied at the next lock.
pub fn release_handle(key: NodeKey) {
    match GRAPH.try_lock() {
        Ok(mut g) => {
            drain_pending(&mut g);
            g.release(key);
        }
        Err(std::sync::TryLockError::Poisoned(p)) => {
            let mut g = p.into_inner();
            drain_pending(&mut g);
            g.release(key);
        }
        Err(std::sync::TryLockError::WouldBlock) => {
            PENDING_RELEASES
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(key);
            HAS_PENDING.store(true, std::sync::atomic::Ordering::Release);
        }
    }
}

/// Number of live nodes in the process-wide graph.
pub fn live_nodes() -> usize {
    with_graph(|g| g.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;
    use std::collections::HashSet;

    /// A small xorshift generator (the test needs no statistics).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    /// Random graphs of pending computations over realized tensors, their aliases
    /// (`detach`) and in-place writes, some handles dropped: the one walk for every write
    /// finds, per write, the readers that a walk per write and per start finds.
    #[test]
    fn one_walk_for_all_writes_finds_what_a_walk_per_write_finds() {
        let mut checked = 0;
        for seed in 1..=60u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut pool: Vec<Tensor> = (0..4)
                .map(|i| {
                    let t = Tensor::from_vec(vec![i as f32; 4], [4]);
                    t.realize().expect("realizes");
                    t
                })
                .collect();
            for _ in 0..30 {
                let a = pool[rng.below(pool.len())].clone();
                let b = pool[rng.below(pool.len())].clone();
                match rng.below(8) {
                    0 => pool.push(&a + &b),
                    1 => pool.push((&a * &b).exp()),
                    2 => pool.push(-&a),
                    3 => {
                        let d = a.detach();
                        pool.push(d);
                    }
                    4 | 5 => {
                        let _ = a.try_add_(&b);
                    }
                    6 => {
                        let _ = a.try_mul_(2.0);
                    }
                    _ => {
                        if pool.len() > 3 {
                            let i = rng.below(pool.len());
                            pool.swap_remove(i);
                        }
                    }
                }
            }
            with_graph(|g| {
                let mut writes = vec![];
                for n in g.nodes().filter(|n| n.op == Op::Assign) {
                    let old = g.inputs(n.key).expect("inputs")[0];
                    let mut starts = vec![old];
                    starts.extend(g.buffer_aliases(old).expect("aliases"));
                    writes.push((starts, n.key));
                }
                let shared = g.live_readers_of(&writes).expect("one walk");
                assert_eq!(shared.len(), writes.len());
                for ((starts, k), got) in writes.iter().zip(&shared) {
                    let mut want = HashSet::new();
                    for &s in starts {
                        want.extend(g.live_readers(s, *k).expect("walk"));
                    }
                    let got_set: HashSet<NodeKey> = got.iter().copied().collect();
                    assert_eq!(
                        got_set.len(),
                        got.len(),
                        "seed {seed}: a reader listed twice"
                    );
                    assert_eq!(got_set, want, "seed {seed}");
                    checked += usize::from(!want.is_empty());
                }
            });
        }
        assert!(checked > 50, "only {checked} writes had readers");
    }
}
