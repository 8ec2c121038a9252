//! Recurrent layers, PyTorch's `nn.RNNCell`, `nn.LSTMCell`, `nn.GRUCell` and the sequence
//! modules `nn.RNN`, `nn.LSTM`, `nn.GRU`, with PyTorch's parameter names, layouts, gate
//! orders and initialization, so that a PyTorch `state_dict` loads into them by name.
//!
//! A sequence module unrolls its time loop into the lazy graph: the input projection of
//! every time step is one matrix product per layer and direction, recorded before the
//! loop; each step records the recurrent product and the gate arithmetic (which fuses).
//! A forward and backward pass over the whole sequence then plans and runs as one graph.

use super::conv::require_float;
use super::init::{derive_seed, uniform};
use super::{Dropout, Module};
use crate::error::{KilnError, Result};
use crate::tensor::Tensor;

/// The activation of an Elman RNN ([`RnnCell`], [`Rnn`]): PyTorch's `nonlinearity`
/// argument, `'tanh'` (the default) or `'relu'`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Nonlinearity {
    /// `h' = tanh(W_ih x + b_ih + W_hh h + b_hh)`.
    #[default]
    Tanh,
    /// `h' = relu(W_ih x + b_ih + W_hh h + b_hh)`.
    Relu,
}

/// Which recurrence a layer computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rnn(Nonlinearity),
    Lstm,
    Gru,
}

impl Kind {
    /// How many gate blocks the stacked weights hold.
    fn gates(self) -> usize {
        match self {
            Kind::Rnn(_) => 1,
            Kind::Lstm => 4,
            Kind::Gru => 3,
        }
    }

    fn cell_op(self) -> &'static str {
        match self {
            Kind::Rnn(_) => "RNNCell",
            Kind::Lstm => "LSTMCell",
            Kind::Gru => "GRUCell",
        }
    }

    fn sequence_op(self) -> &'static str {
        match self {
            Kind::Rnn(_) => "RNN",
            Kind::Lstm => "LSTM",
            Kind::Gru => "GRU",
        }
    }
}

/// The weights of one cell, or of one layer and direction of a sequence module, in
/// PyTorch's layouts: the gate blocks are stacked along dimension 0 in PyTorch's order
/// (LSTM: input, forget, cell, output; GRU: reset, update, new).
#[derive(Debug, Clone)]
pub struct RecurrentWeights {
    /// `weight_ih`, `[gates·hidden, input]`.
    pub weight_ih: Tensor,
    /// `weight_hh`, `[gates·hidden, hidden]` (`[4·hidden, proj_size]` for an LSTM with a
    /// projection).
    pub weight_hh: Tensor,
    /// `bias_ih`, `[gates·hidden]`, if the module has biases.
    pub bias_ih: Option<Tensor>,
    /// `bias_hh`, `[gates·hidden]`, if the module has biases.
    pub bias_hh: Option<Tensor>,
    /// `weight_hr`, `[proj_size, hidden]`: an LSTM's output projection, if it has one.
    pub weight_hr: Option<Tensor>,
}

impl RecurrentWeights {
    /// PyTorch's initialization: every parameter uniform in `±1/√hidden`, each seeded by
    /// its full name (`weight_ih_l1_reverse`).
    fn new(
        kind: Kind,
        [input, hidden, proj]: [usize; 3],
        bias: bool,
        seed: u64,
        suffix: &str,
    ) -> Result<RecurrentWeights> {
        let k = 1.0 / (hidden as f64).sqrt();
        let g = kind.gates() * hidden;
        let recurrent = if proj > 0 { proj } else { hidden };
        let draw = |name: &str, shape: &[usize]| {
            uniform(shape, -k, k, derive_seed(seed, &format!("{name}{suffix}")))
        };
        let biases = |name: &str| -> Result<Option<Tensor>> {
            if bias {
                draw(name, &[g]).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(RecurrentWeights {
            weight_ih: draw("weight_ih", &[g, input])?,
            weight_hh: draw("weight_hh", &[g, recurrent])?,
            bias_ih: biases("bias_ih")?,
            bias_hh: biases("bias_hh")?,
            weight_hr: if proj > 0 {
                Some(draw("weight_hr", &[proj, hidden])?)
            } else {
                None
            },
        })
    }

    /// Visits the parameters in PyTorch's order, each name followed by `suffix`.
    fn visit(&self, suffix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&format!("weight_ih{suffix}"), &self.weight_ih);
        f(&format!("weight_hh{suffix}"), &self.weight_hh);
        for (name, t) in [
            ("bias_ih", &self.bias_ih),
            ("bias_hh", &self.bias_hh),
            ("weight_hr", &self.weight_hr),
        ] {
            if let Some(t) = t {
                f(&format!("{name}{suffix}"), t);
            }
        }
    }

    /// [`RecurrentWeights::visit`] with each parameter replaceable.
    fn visit_mut(&mut self, suffix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        f(&format!("weight_ih{suffix}"), &mut self.weight_ih);
        f(&format!("weight_hh{suffix}"), &mut self.weight_hh);
        for (name, t) in [
            ("bias_ih", &mut self.bias_ih),
            ("bias_hh", &mut self.bias_hh),
            ("weight_hr", &mut self.weight_hr),
        ] {
            if let Some(t) = t {
                f(&format!("{name}{suffix}"), t);
            }
        }
    }

    /// The transposed weights and biases one time step reads, recorded once per sequence.
    fn prepare(&self, kind: Kind) -> Result<Prepared> {
        // An RNN's and an LSTM's hidden bias adds to the input projection; a GRU's stays
        // with the recurrent product (its `new` gate scales it by the reset gate).
        let (input_bias, hidden_bias) = match (kind, &self.bias_ih, &self.bias_hh) {
            (Kind::Gru, bi, bh) => (bi.clone(), bh.clone()),
            (_, Some(bi), Some(bh)) => (Some(bi.try_add(bh)?), None),
            (_, bi, bh) => (bi.clone().or_else(|| bh.clone()), None),
        };
        Ok(Prepared {
            kind,
            weight_ih_t: self.weight_ih.try_transpose(0, 1)?,
            input_bias,
            weight_hh_t: self.weight_hh.try_transpose(0, 1)?,
            hidden_bias,
            weight_hr_t: self
                .weight_hr
                .as_ref()
                .map(|w| w.try_transpose(0, 1))
                .transpose()?,
        })
    }
}

/// One layer and direction's weights as a time step reads them.
struct Prepared {
    kind: Kind,
    weight_ih_t: Tensor,
    input_bias: Option<Tensor>,
    weight_hh_t: Tensor,
    hidden_bias: Option<Tensor>,
    weight_hr_t: Option<Tensor>,
}

fn plus(a: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    match b {
        Some(b) => a.try_add(b),
        None => Ok(a.clone()),
    }
}

impl Prepared {
    /// `x W_ihᵀ + bias` over `x [.., input]`, every time step at once.
    fn project_input(&self, x: &Tensor) -> Result<Tensor> {
        let lead: Vec<isize> = x.shape()[..x.ndim() - 1]
            .iter()
            .map(|&d| d as isize)
            .collect();
        let flat = x.try_reshape([-1, x.shape()[x.ndim() - 1] as isize])?;
        let y = plus(
            &flat.try_matmul(&self.weight_ih_t)?,
            self.input_bias.as_ref(),
        )?;
        let mut shape = lead;
        shape.push(y.shape()[1] as isize);
        y.try_reshape(&shape)
    }

    /// One time step from the projected input `xp [.., gates·hidden]` and the state
    /// (`None`: zeros, whose products are skipped). Returns `h'` and, for an LSTM, `c'`.
    fn step(
        &self,
        xp: &Tensor,
        h: Option<&Tensor>,
        c: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let hh = match h {
            Some(h) => Some(plus(
                &h.try_matmul(&self.weight_hh_t)?,
                self.hidden_bias.as_ref(),
            )?),
            None => self.hidden_bias.clone(),
        };
        match self.kind {
            Kind::Rnn(nl) => {
                let pre = plus(xp, hh.as_ref())?;
                let h = match nl {
                    Nonlinearity::Tanh => pre.try_tanh()?,
                    Nonlinearity::Relu => pre.try_relu()?,
                };
                Ok((h, None))
            }
            Kind::Lstm => {
                let gates = plus(xp, hh.as_ref())?.try_chunk(4, -1)?;
                let i = gates[0].try_sigmoid()?;
                let f = gates[1].try_sigmoid()?;
                let g = gates[2].try_tanh()?;
                let o = gates[3].try_sigmoid()?;
                let mut c_new = i.try_mul(&g)?;
                if let Some(c) = c {
                    c_new = f.try_mul(c)?.try_add(&c_new)?;
                }
                let mut h_new = o.try_mul(&c_new.try_tanh()?)?;
                if let Some(w) = &self.weight_hr_t {
                    h_new = h_new.try_matmul(w)?;
                }
                Ok((h_new, Some(c_new)))
            }
            Kind::Gru => {
                let x = xp.try_chunk(3, -1)?;
                let hp = hh.map(|t| t.try_chunk(3, -1)).transpose()?;
                let part = |k: usize| plus(&x[k], hp.as_ref().map(|p| &p[k]));
                let r = part(0)?.try_sigmoid()?;
                let z = part(1)?.try_sigmoid()?;
                let n = match &hp {
                    Some(p) => x[2].try_add(&r.try_mul(&p[2])?)?,
                    None => x[2].clone(),
                }
                .try_tanh()?;
                // h' = (1 - z)·n + z·h = n + z·(h - n).
                let h_new = match h {
                    Some(h) => n.try_add(&z.try_mul(&h.try_sub(&n)?)?)?,
                    None => n.try_sub(&z.try_mul(&n)?)?,
                };
                Ok((h_new, None))
            }
        }
    }
}

fn check_features(op: &'static str, x: &Tensor, input_size: usize) -> Result<()> {
    let got = x.shape()[x.ndim() - 1];
    if got == input_size {
        Ok(())
    } else {
        Err(KilnError::InvalidArgument {
            op,
            shape: x.shape().to_vec(),
            reason: format!(
                "input.size(-1) must be equal to input_size: expected {input_size}, got {got}"
            ),
        })
    }
}

/// Checks a state against the shape it must have (`expect`, batched form), accepting the
/// unbatched form (without dimension `batch_axis`) when the input is unbatched; returns
/// it in the batched form.
fn check_state(
    op: &'static str,
    name: &str,
    s: &Tensor,
    batched: bool,
    expect: &[usize],
    batch_axis: usize,
) -> Result<Tensor> {
    let want = if batched {
        expect.to_vec()
    } else {
        let mut e = expect.to_vec();
        e.remove(batch_axis);
        e
    };
    if s.shape() != want.as_slice() {
        return Err(KilnError::InvalidShape {
            op,
            shape: s.shape().to_vec(),
            requested: want.iter().map(|&d| d as isize).collect(),
            reason: format!(
                "{name} must have shape {want:?} for {} input",
                if batched { "a batched" } else { "an unbatched" }
            ),
        });
    }
    if batched {
        Ok(s.clone())
    } else {
        s.try_unsqueeze(batch_axis as isize)
    }
}

fn check_hidden(op: &'static str, hidden_size: usize) -> Result<()> {
    if hidden_size == 0 {
        return Err(KilnError::InvalidArgument {
            op,
            shape: vec![hidden_size],
            reason: "hidden_size must be greater than zero".into(),
        });
    }
    Ok(())
}

/// The state of one cell, shared by the three cell types.
#[derive(Debug, Clone)]
struct Cell {
    kind: Kind,
    input_size: usize,
    hidden_size: usize,
    weights: RecurrentWeights,
}

impl Cell {
    fn new(
        kind: Kind,
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        seed: u64,
    ) -> Result<Cell> {
        check_hidden(kind.cell_op(), hidden_size)?;
        Ok(Cell {
            kind,
            input_size,
            hidden_size,
            weights: RecurrentWeights::new(kind, [input_size, hidden_size, 0], bias, seed, "")?,
        })
    }

    /// One step over `x [batch, input]` or `[input]` from `h` (and `c`), zeros if absent.
    fn run(
        &self,
        x: &Tensor,
        h: Option<&Tensor>,
        c: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let op = self.kind.cell_op();
        require_float(op, x)?;
        if x.ndim() != 1 && x.ndim() != 2 {
            return Err(KilnError::InvalidShape {
                op,
                shape: x.shape().to_vec(),
                requested: vec![-1, self.input_size as isize],
                reason: format!("expects a 1-D or 2-D input, got {}-D", x.ndim()),
            });
        }
        check_features(op, x, self.input_size)?;
        let batched = x.ndim() == 2;
        let x = if batched {
            x.clone()
        } else {
            x.try_unsqueeze(0)?
        };
        let expect = [x.shape()[0], self.hidden_size];
        let h = h
            .map(|h| check_state(op, "hx", h, batched, &expect, 0))
            .transpose()?;
        let c = c
            .map(|c| check_state(op, "cx", c, batched, &expect, 0))
            .transpose()?;
        let p = self.weights.prepare(self.kind)?;
        let (h, c) = p.step(&p.project_input(&x)?, h.as_ref(), c.as_ref())?;
        if batched {
            Ok((h, c))
        } else {
            Ok((
                h.try_squeeze_dim(0)?,
                c.map(|c| c.try_squeeze_dim(0)).transpose()?,
            ))
        }
    }
}

macro_rules! cell_module {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone)]
        pub struct $name {
            cell: Cell,
        }

        impl $name {
            /// The number of input features.
            pub fn input_size(&self) -> usize {
                self.cell.input_size
            }

            /// The number of hidden features.
            pub fn hidden_size(&self) -> usize {
                self.cell.hidden_size
            }

            /// The parameters (also visited by name through [`Module`]).
            pub fn weights(&self) -> &RecurrentWeights {
                &self.cell.weights
            }
        }

        impl Module for $name {
            /// One step from a zero state, giving the new hidden state `h'`.
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                Ok(self.cell.run(x, None, None)?.0)
            }

            fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
                self.cell.weights.visit("", f);
            }

            fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
                self.cell.weights.visit_mut("", f);
            }

            /// No mode: the same in training and evaluation.
            fn set_training(&mut self, _training: bool) {}
        }
    };
}

cell_module!(
    RnnCell,
    "PyTorch's `nn.RNNCell`: `h' = act(x W_ihᵀ + b_ih + h W_hhᵀ + b_hh)` with `act` tanh or \
     ReLU ([`Nonlinearity`]); parameters `weight_ih [hidden, input]`, `weight_hh [hidden, \
     hidden]`, `bias_ih`, `bias_hh` (`[hidden]`), uniform in `±1/√hidden`."
);
cell_module!(
    LstmCell,
    "PyTorch's `nn.LSTMCell`: gates `i, f, g, o` (in that order along `weight_ih [4·hidden, \
     input]`, `weight_hh [4·hidden, hidden]`, `bias_ih`, `bias_hh`), `c' = σ(f)·c + \
     σ(i)·tanh(g)`, `h' = σ(o)·tanh(c')`; parameters uniform in `±1/√hidden`."
);
cell_module!(
    GruCell,
    "PyTorch's `nn.GRUCell`: gates `r, z, n` (in that order along `weight_ih [3·hidden, \
     input]`, `weight_hh [3·hidden, hidden]`, `bias_ih`, `bias_hh`), `r = σ(W_ir x + b_ir + \
     W_hr h + b_hr)`, `z` likewise, `n = tanh(W_in x + b_in + r·(W_hn h + b_hn))`, `h' = \
     (1 - z)·n + z·h`; parameters uniform in `±1/√hidden`."
);

impl RnnCell {
    /// PyTorch's `nn.RNNCell(input_size, hidden_size, bias, nonlinearity)`, initialized
    /// from `seed`.
    ///
    /// ```
    /// use kiln::nn::{Module, Nonlinearity, RnnCell};
    /// let cell = RnnCell::new(3, 4, true, Nonlinearity::Tanh, 0).unwrap();
    /// let names: Vec<String> = cell.named_parameters().into_iter().map(|(n, _)| n).collect();
    /// assert_eq!(names, ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]);
    /// let h = cell.forward_hx(&kiln::Tensor::ones(&[2, 3]), None).unwrap();
    /// assert_eq!(h.shape(), &[2, 4]);
    /// ```
    pub fn new(
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        nonlinearity: Nonlinearity,
        seed: u64,
    ) -> Result<RnnCell> {
        Ok(RnnCell {
            cell: Cell::new(Kind::Rnn(nonlinearity), input_size, hidden_size, bias, seed)?,
        })
    }

    /// The activation.
    pub fn nonlinearity(&self) -> Nonlinearity {
        match self.cell.kind {
            Kind::Rnn(nl) => nl,
            _ => Nonlinearity::Tanh,
        }
    }

    /// PyTorch's `cell(input, hx)`: `input [batch, input]` (or unbatched `[input]`) and
    /// `hx` of shape `[batch, hidden]` (`[hidden]`), zeros when `None`; gives `h'`.
    pub fn forward_hx(&self, x: &Tensor, hx: Option<&Tensor>) -> Result<Tensor> {
        Ok(self.cell.run(x, hx, None)?.0)
    }
}

impl LstmCell {
    /// PyTorch's `nn.LSTMCell(input_size, hidden_size, bias)`, initialized from `seed`.
    pub fn new(input_size: usize, hidden_size: usize, bias: bool, seed: u64) -> Result<LstmCell> {
        Ok(LstmCell {
            cell: Cell::new(Kind::Lstm, input_size, hidden_size, bias, seed)?,
        })
    }

    /// PyTorch's `cell(input, (h, c))`: `input [batch, input]` (or unbatched `[input]`),
    /// `h` and `c` of shape `[batch, hidden]` (`[hidden]`), zeros when `None`; gives
    /// `(h', c')`.
    pub fn forward_hx(
        &self,
        x: &Tensor,
        hx: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, Tensor)> {
        let (h, c) = match hx {
            Some((h, c)) => (Some(h), Some(c)),
            None => (None, None),
        };
        let (h, c) = self.cell.run(x, h, c)?;
        let c = c.ok_or_else(|| missing_cell_state("LSTMCell", x))?;
        Ok((h, c))
    }
}

/// An LSTM step always gives a cell state; this is the error if that ever failed.
fn missing_cell_state(op: &'static str, x: &Tensor) -> KilnError {
    KilnError::InvalidArgument {
        op,
        shape: x.shape().to_vec(),
        reason: "the LSTM step produced no cell state".into(),
    }
}

impl GruCell {
    /// PyTorch's `nn.GRUCell(input_size, hidden_size, bias)`, initialized from `seed`.
    pub fn new(input_size: usize, hidden_size: usize, bias: bool, seed: u64) -> Result<GruCell> {
        Ok(GruCell {
            cell: Cell::new(Kind::Gru, input_size, hidden_size, bias, seed)?,
        })
    }

    /// PyTorch's `cell(input, hx)`: `input [batch, input]` (or unbatched `[input]`) and
    /// `hx` of shape `[batch, hidden]` (`[hidden]`), zeros when `None`; gives `h'`.
    pub fn forward_hx(&self, x: &Tensor, hx: Option<&Tensor>) -> Result<Tensor> {
        Ok(self.cell.run(x, hx, None)?.0)
    }
}

/// The options of PyTorch's `nn.RNN`, `nn.LSTM` and `nn.GRU` constructors, with PyTorch's
/// defaults (`RecurrentOptions::default()`): one layer, biases, time-major input, no
/// dropout, one direction, tanh, no projection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecurrentOptions {
    /// Stacked layers; each layer after the first reads the previous one's output.
    pub num_layers: usize,
    /// Whether the layers have `bias_ih` and `bias_hh`.
    pub bias: bool,
    /// Inputs and outputs `[batch, time, features]` instead of `[time, batch, features]`
    /// (the states `h_0`, `h_n` stay `[layers·directions, batch, hidden]`).
    pub batch_first: bool,
    /// Dropout probability on each layer's output but the last's, in training only.
    pub dropout: f64,
    /// Whether each layer also runs backwards in time (outputs concatenated, forward
    /// direction first; states interleaved `l0, l0_reverse, l1, ..`).
    pub bidirectional: bool,
    /// The activation ([`Rnn`] only; [`Lstm`] and [`Gru`] refuse `Relu`).
    pub nonlinearity: Nonlinearity,
    /// An LSTM's output projection size (0: none; [`Rnn`] and [`Gru`] refuse others).
    pub proj_size: usize,
}

impl Default for RecurrentOptions {
    fn default() -> Self {
        RecurrentOptions {
            num_layers: 1,
            bias: true,
            batch_first: false,
            dropout: 0.0,
            bidirectional: false,
            nonlinearity: Nonlinearity::Tanh,
            proj_size: 0,
        }
    }
}

/// The layers of one sequence module, shared by the three types.
#[derive(Debug, Clone)]
struct Stack {
    kind: Kind,
    input_size: usize,
    hidden_size: usize,
    options: RecurrentOptions,
    weights: Vec<RecurrentWeights>,
    dropout: Dropout,
}

impl Stack {
    fn new(
        kind: Kind,
        input_size: usize,
        hidden_size: usize,
        options: RecurrentOptions,
        seed: u64,
    ) -> Result<Stack> {
        let op = kind.sequence_op();
        let bad = |reason: String| {
            Err(KilnError::InvalidArgument {
                op,
                shape: vec![input_size, hidden_size],
                reason,
            })
        };
        check_hidden(op, hidden_size)?;
        if options.num_layers == 0 {
            return bad("num_layers must be greater than zero".into());
        }
        if !(0.0..=1.0).contains(&options.dropout) {
            return bad(format!(
                "dropout should be a probability in [0, 1], not {}",
                options.dropout
            ));
        }
        if kind != Kind::Lstm && options.proj_size > 0 {
            return bad("proj_size is only supported by LSTM, not RNN or GRU".into());
        }
        if options.proj_size >= hidden_size && options.proj_size > 0 {
            return bad(format!(
                "proj_size {} has to be smaller than hidden_size {hidden_size}",
                options.proj_size
            ));
        }
        if !matches!(kind, Kind::Rnn(_)) && options.nonlinearity != Nonlinearity::Tanh {
            return bad("only RNN takes a nonlinearity".into());
        }
        let dirs = if options.bidirectional { 2 } else { 1 };
        let out = if options.proj_size > 0 {
            options.proj_size
        } else {
            hidden_size
        };
        let mut weights = vec![];
        for layer in 0..options.num_layers {
            let inputs = if layer == 0 { input_size } else { out * dirs };
            for dir in 0..dirs {
                weights.push(RecurrentWeights::new(
                    kind,
                    [inputs, hidden_size, options.proj_size],
                    options.bias,
                    seed,
                    &Stack::suffix(layer, dir),
                )?);
            }
        }
        Ok(Stack {
            kind,
            input_size,
            hidden_size,
            options,
            weights,
            dropout: Dropout::new(options.dropout, derive_seed(seed, "dropout")),
        })
    }

    fn suffix(layer: usize, dir: usize) -> String {
        format!("_l{layer}{}", if dir == 1 { "_reverse" } else { "" })
    }

    fn directions(&self) -> usize {
        if self.options.bidirectional { 2 } else { 1 }
    }

    fn visit(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        let d = self.directions();
        for (i, w) in self.weights.iter().enumerate() {
            w.visit(&Stack::suffix(i / d, i % d), f);
        }
    }

    fn visit_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        let d = self.directions();
        for (i, w) in self.weights.iter_mut().enumerate() {
            w.visit_mut(&Stack::suffix(i / d, i % d), f);
        }
    }

    /// The whole sequence: `(output, h_n, c_n)`, `c_n` for an LSTM only.
    fn run(
        &self,
        x: &Tensor,
        h0: Option<&Tensor>,
        c0: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let op = self.kind.sequence_op();
        require_float(op, x)?;
        if x.ndim() != 2 && x.ndim() != 3 {
            return Err(KilnError::InvalidShape {
                op,
                shape: x.shape().to_vec(),
                requested: vec![-1, -1, self.input_size as isize],
                reason: format!("expects a 2-D (unbatched) or 3-D input, got {}-D", x.ndim()),
            });
        }
        check_features(op, x, self.input_size)?;
        let batched = x.ndim() == 3;
        let first = self.options.batch_first;
        // Time-major from here on: [time, batch, features].
        let x = if !batched {
            x.try_unsqueeze(1)?
        } else if first {
            x.try_transpose(0, 1)?
        } else {
            x.clone()
        };
        let (steps, batch) = (x.shape()[0], x.shape()[1]);
        if steps == 0 {
            return Err(KilnError::InvalidArgument {
                op,
                shape: x.shape().to_vec(),
                reason: "expected a sequence length larger than 0".into(),
            });
        }
        let dirs = self.directions();
        let layers = self.options.num_layers * dirs;
        let out = if self.options.proj_size > 0 {
            self.options.proj_size
        } else {
            self.hidden_size
        };
        let h0 = h0
            .map(|h| check_state(op, "h_0", h, batched, &[layers, batch, out], 1))
            .transpose()?;
        let c0 = c0
            .map(|c| check_state(op, "c_0", c, batched, &[layers, batch, self.hidden_size], 1))
            .transpose()?;
        let initial = |s: &Option<Tensor>, i: usize| {
            s.as_ref().map(|s| s.try_select(0, i as i64)).transpose()
        };
        let (mut h_n, mut c_n) = (vec![], vec![]);
        let mut input = x;
        for layer in 0..self.options.num_layers {
            let mut outputs = vec![];
            for dir in 0..dirs {
                let i = layer * dirs + dir;
                let p = self.weights[i].prepare(self.kind)?;
                let xp = p.project_input(&input)?;
                let (mut h, mut c) = (initial(&h0, i)?, initial(&c0, i)?);
                let mut ys: Vec<Option<Tensor>> = vec![None; steps];
                for k in 0..steps {
                    let t = if dir == 0 { k } else { steps - 1 - k };
                    let (hn, cn) = p.step(&xp.try_select(0, t as i64)?, h.as_ref(), c.as_ref())?;
                    ys[t] = Some(hn.clone());
                    h = Some(hn);
                    c = cn;
                }
                let ys: Vec<Tensor> = ys.into_iter().flatten().collect();
                outputs.push(Tensor::try_stack(&ys.iter().collect::<Vec<_>>(), 0)?);
                h_n.extend(h);
                c_n.extend(c);
            }
            let mut y = Tensor::try_cat(&outputs.iter().collect::<Vec<_>>(), -1)?;
            if layer + 1 < self.options.num_layers {
                y = self.dropout.forward(&y)?;
            }
            input = y;
        }
        let h_n = Tensor::try_stack(&h_n.iter().collect::<Vec<_>>(), 0)?;
        let c_n = if c_n.is_empty() {
            None
        } else {
            Some(Tensor::try_stack(&c_n.iter().collect::<Vec<_>>(), 0)?)
        };
        if !batched {
            Ok((
                input.try_squeeze_dim(1)?,
                h_n.try_squeeze_dim(1)?,
                c_n.map(|c| c.try_squeeze_dim(1)).transpose()?,
            ))
        } else if first {
            Ok((input.try_transpose(0, 1)?, h_n, c_n))
        } else {
            Ok((input, h_n, c_n))
        }
    }
}

macro_rules! sequence_module {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone)]
        pub struct $name {
            stack: Stack,
        }

        impl $name {
            /// The number of input features.
            pub fn input_size(&self) -> usize {
                self.stack.input_size
            }

            /// The number of hidden features.
            pub fn hidden_size(&self) -> usize {
                self.stack.hidden_size
            }

            /// The options it was made with.
            pub fn options(&self) -> &RecurrentOptions {
                &self.stack.options
            }

            /// The parameters of each layer and direction, in the order `l0`,
            /// `l0_reverse` (if bidirectional), `l1`, ... (also visited by name through
            /// [`Module`]).
            pub fn weights(&self) -> &[RecurrentWeights] {
                &self.stack.weights
            }
        }

        impl Module for $name {
            /// The output sequence from zero initial states (the states are dropped).
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                Ok(self.stack.run(x, None, None)?.0)
            }

            fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
                self.stack.visit(f);
            }

            fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
                self.stack.visit_mut(f);
            }

            /// Dropout between layers is on in training only.
            fn set_training(&mut self, training: bool) {
                self.stack.dropout.set_training(training);
            }
        }
    };
}

sequence_module!(
    Rnn,
    "PyTorch's `nn.RNN`: a stack of Elman RNN layers ([`RnnCell`]'s step) over a sequence. \
     Parameters `weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}` (with \
     `_reverse` for the backward direction), uniform in `±1/√hidden`."
);
sequence_module!(
    Lstm,
    "PyTorch's `nn.LSTM`: a stack of LSTM layers ([`LstmCell`]'s step) over a sequence, \
     optionally with PyTorch's output projection (`proj_size`: `h = (σ(o)·tanh(c)) W_hrᵀ`). \
     Parameters `weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}`, \
     `weight_hr_l{k}` (with `_reverse` for the backward direction), uniform in `±1/√hidden`."
);
sequence_module!(
    Gru,
    "PyTorch's `nn.GRU`: a stack of GRU layers ([`GruCell`]'s step) over a sequence. \
     Parameters `weight_ih_l{k}`, `weight_hh_l{k}`, `bias_ih_l{k}`, `bias_hh_l{k}` (with \
     `_reverse` for the backward direction), uniform in `±1/√hidden`."
);

impl Rnn {
    /// PyTorch's `nn.RNN(input_size, hidden_size)`: one tanh layer, initialized from `seed`.
    pub fn new(input_size: usize, hidden_size: usize, seed: u64) -> Result<Rnn> {
        Rnn::with_options(input_size, hidden_size, RecurrentOptions::default(), seed)
    }

    /// PyTorch's `nn.RNN(input_size, hidden_size, num_layers, nonlinearity, bias,
    /// batch_first, dropout, bidirectional)`, initialized from `seed`.
    ///
    /// ```
    /// use kiln::nn::{Module, Nonlinearity, RecurrentOptions, Rnn};
    /// let opts = RecurrentOptions { num_layers: 2, bidirectional: true,
    ///     nonlinearity: Nonlinearity::Relu, ..Default::default() };
    /// let rnn = Rnn::with_options(3, 5, opts, 0).unwrap();
    /// let (out, h_n) = rnn.forward_hx(&kiln::Tensor::ones(&[7, 2, 3]), None).unwrap();
    /// assert_eq!((out.shape(), h_n.shape()), (&[7, 2, 10][..], &[4, 2, 5][..]));
    /// ```
    pub fn with_options(
        input_size: usize,
        hidden_size: usize,
        options: RecurrentOptions,
        seed: u64,
    ) -> Result<Rnn> {
        Ok(Rnn {
            stack: Stack::new(
                Kind::Rnn(options.nonlinearity),
                input_size,
                hidden_size,
                options,
                seed,
            )?,
        })
    }

    /// PyTorch's `rnn(input, h_0)`: `input [time, batch, input]` (`[batch, time, input]`
    /// with `batch_first`, `[time, input]` unbatched) and `h_0 [layers·directions, batch,
    /// hidden]` (`[layers·directions, hidden]` unbatched), zeros when `None`; gives
    /// `(output, h_n)`, `output [time, batch, directions·hidden]` (batch first or
    /// unbatched as the input) and `h_n` shaped as `h_0`.
    pub fn forward_hx(&self, x: &Tensor, h0: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let (y, h, _) = self.stack.run(x, h0, None)?;
        Ok((y, h))
    }
}

impl Lstm {
    /// PyTorch's `nn.LSTM(input_size, hidden_size)`: one layer, initialized from `seed`.
    pub fn new(input_size: usize, hidden_size: usize, seed: u64) -> Result<Lstm> {
        Lstm::with_options(input_size, hidden_size, RecurrentOptions::default(), seed)
    }

    /// PyTorch's `nn.LSTM(input_size, hidden_size, num_layers, bias, batch_first, dropout,
    /// bidirectional, proj_size)`, initialized from `seed`.
    pub fn with_options(
        input_size: usize,
        hidden_size: usize,
        options: RecurrentOptions,
        seed: u64,
    ) -> Result<Lstm> {
        Ok(Lstm {
            stack: Stack::new(Kind::Lstm, input_size, hidden_size, options, seed)?,
        })
    }

    /// PyTorch's `lstm(input, (h_0, c_0))`: shapes as [`Rnn::forward_hx`], with `h_0`'s
    /// last dimension `proj_size` when there is a projection and `c_0 [layers·directions,
    /// batch, hidden]`; gives `(output, (h_n, c_n))`.
    pub fn forward_hx(
        &self,
        x: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        let (h0, c0) = match state {
            Some((h, c)) => (Some(h), Some(c)),
            None => (None, None),
        };
        let (y, h, c) = self.stack.run(x, h0, c0)?;
        let c = c.ok_or_else(|| missing_cell_state("LSTM", x))?;
        Ok((y, (h, c)))
    }
}

impl Gru {
    /// PyTorch's `nn.GRU(input_size, hidden_size)`: one layer, initialized from `seed`.
    pub fn new(input_size: usize, hidden_size: usize, seed: u64) -> Result<Gru> {
        Gru::with_options(input_size, hidden_size, RecurrentOptions::default(), seed)
    }

    /// PyTorch's `nn.GRU(input_size, hidden_size, num_layers, bias, batch_first, dropout,
    /// bidirectional)`, initialized from `seed`.
    pub fn with_options(
        input_size: usize,
        hidden_size: usize,
        options: RecurrentOptions,
        seed: u64,
    ) -> Result<Gru> {
        Ok(Gru {
            stack: Stack::new(Kind::Gru, input_size, hidden_size, options, seed)?,
        })
    }

    /// PyTorch's `gru(input, h_0)`: shapes as [`Rnn::forward_hx`]; gives `(output, h_n)`.
    pub fn forward_hx(&self, x: &Tensor, h0: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
        let (y, h, _) = self.stack.run(x, h0, None)?;
        Ok((y, h))
    }
}
