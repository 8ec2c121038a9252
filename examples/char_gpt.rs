//! A character-level GPT on Shakespeare (shipped in `data/`), in the configuration the
//! training issue fixes so it can be compared with other frameworks: 4 layers, 4 heads,
//! width 128, context 64, batch 32, vocabulary = the text's characters, 90/10 train/val
//! split, learned position embeddings, pre-LayerNorm blocks with a GELU MLP (4× width),
//! AdamW (lr 3e-3, betas 0.9/0.99, weight decay 0.1 on matrices and embeddings), linear
//! warmup over 100 steps then cosine decay to 10% at 2,000 steps, gradient clipping at 1.0,
//! no dropout. `benches/char_gpt_torch.py` is the same model in PyTorch.
//!
//! `cargo run --release --example char_gpt -- [--steps N] [--device cuda] [--checkpoint PATH] [--resume PATH]`
//!
//! `--checkpoint PATH` saves the model's state dict to `PATH` after the last training step
//! and the training state (AdamW's moments, step counts and options, the step reached, the
//! batch sampler's state) to `PATH.train`; `--resume PATH` restores both and continues
//! from the step reached up to `--steps` (the schedule goes on where it stopped), so a run
//! of 2,000 steps in two halves trains as one run does.

use kiln::nn::functional::cross_entropy;
use kiln::nn::init::derive_seed;
use kiln::nn::{
    Block, Embedding, LayerNorm, Linear, Module, visit_child, visit_child_buffers,
    visit_child_buffers_mut, visit_child_mut,
};
use kiln::optim::{AdamW, AdamWOptions, Optimizer, ParamGroup, WarmupCosine, clip_grad_norm};
use kiln::{DType, Device, RealizeOptions, Tensor, memory, no_grad};
use std::time::Instant;

const LAYERS: usize = 4;
const HEADS: usize = 4;
const WIDTH: usize = 128;
const CONTEXT: usize = 64;
const BATCH: usize = 32;

struct Gpt {
    tok: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
}

impl Gpt {
    fn new(vocab: usize, seed: u64) -> kiln::Result<Gpt> {
        // GPT-2 style initialization: N(0, 0.02) for matrices and embeddings, each
        // parameter seeded by its name (seeds made by small offsets would give two
        // parameters the same values: `nn::init::derive_seed`).
        let normal = |shape: &[usize], name: &str| {
            kiln::nn::init::normal(shape, 0.0, 0.02, derive_seed(seed, name))
        };
        let mut blocks = vec![];
        for l in 0..LAYERS {
            let mut b = Block::new(WIDTH, HEADS, 0.0, derive_seed(seed, &format!("blocks.{l}")))?;
            let name = |p: &str| format!("blocks.{l}.{p}.weight");
            b.attn.qkv.weight = normal(&[3 * WIDTH, WIDTH], &name("attn.qkv"))?;
            b.attn.proj.weight = normal(&[WIDTH, WIDTH], &name("attn.proj"))?;
            b.fc.weight = normal(&[4 * WIDTH, WIDTH], &name("mlp.fc"))?;
            b.proj.weight = normal(&[WIDTH, 4 * WIDTH], &name("mlp.proj"))?;
            for bias in [
                &mut b.attn.qkv.bias,
                &mut b.attn.proj.bias,
                &mut b.fc.bias,
                &mut b.proj.bias,
            ]
            .into_iter()
            .flatten()
            {
                *bias = kiln::nn::init::constant(bias.shape(), 0.0)?;
            }
            blocks.push(b);
        }
        Ok(Gpt {
            tok: Embedding {
                weight: normal(&[vocab, WIDTH], "tok_emb.weight")?,
                padding_idx: None,
            },
            pos: Embedding {
                weight: normal(&[CONTEXT, WIDTH], "pos_emb.weight")?,
                padding_idx: None,
            },
            blocks,
            ln_f: LayerNorm::new(WIDTH)?,
            head: Linear {
                weight: normal(&[vocab, WIDTH], "head.weight")?,
                bias: None,
            },
        })
    }
}

impl Module for Gpt {
    /// `ids: [batch, time]` to logits `[batch, time, vocab]`.
    fn forward(&self, ids: &Tensor) -> kiln::Result<Tensor> {
        let t = ids.shape()[1];
        let positions = self.pos.weight.try_slice(&[(0, t as isize, 1)])?;
        let mut x = self.tok.forward(ids)?.try_add(&positions)?;
        for b in &self.blocks {
            x = b.forward(&x)?;
        }
        self.head.forward(&self.ln_f.forward(&x)?)
    }

    fn visit_parameters(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        visit_child("tok_emb", &self.tok, f);
        visit_child("pos_emb", &self.pos, f);
        for (i, b) in self.blocks.iter().enumerate() {
            visit_child(&format!("blocks.{i}"), b, f);
        }
        visit_child("ln_f", &self.ln_f, f);
        visit_child("head", &self.head, f);
    }

    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        visit_child_mut("tok_emb", &mut self.tok, f);
        visit_child_mut("pos_emb", &mut self.pos, f);
        for (i, b) in self.blocks.iter_mut().enumerate() {
            visit_child_mut(&format!("blocks.{i}"), b, f);
        }
        visit_child_mut("ln_f", &mut self.ln_f, f);
        visit_child_mut("head", &mut self.head, f);
    }

    fn visit_buffers(&self, f: &mut dyn FnMut(&str, &Tensor)) {
        visit_child_buffers("tok_emb", &self.tok, f);
        visit_child_buffers("pos_emb", &self.pos, f);
        for (i, b) in self.blocks.iter().enumerate() {
            visit_child_buffers(&format!("blocks.{i}"), b, f);
        }
        visit_child_buffers("ln_f", &self.ln_f, f);
        visit_child_buffers("head", &self.head, f);
    }

    fn visit_buffers_mut(&mut self, f: &mut dyn FnMut(&str, &mut Tensor)) {
        visit_child_buffers_mut("tok_emb", &mut self.tok, f);
        visit_child_buffers_mut("pos_emb", &mut self.pos, f);
        for (i, b) in self.blocks.iter_mut().enumerate() {
            visit_child_buffers_mut(&format!("blocks.{i}"), b, f);
        }
        visit_child_buffers_mut("ln_f", &mut self.ln_f, f);
        visit_child_buffers_mut("head", &mut self.head, f);
    }

    fn set_training(&mut self, training: bool) {
        for b in &mut self.blocks {
            b.set_training(training);
        }
    }
}

/// A deterministic xorshift generator (batches and sampling).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A batch of windows: inputs and next-character targets, `[BATCH, CONTEXT]` each.
fn batch(data: &[i64], rng: &mut Rng, device: Device) -> (Tensor, Tensor) {
    let mut x = Vec::with_capacity(BATCH * CONTEXT);
    let mut y = Vec::with_capacity(BATCH * CONTEXT);
    for _ in 0..BATCH {
        let s = rng.below(data.len() - CONTEXT - 1);
        x.extend_from_slice(&data[s..s + CONTEXT]);
        y.extend_from_slice(&data[s + 1..s + CONTEXT + 1]);
    }
    (
        Tensor::from_vec(x, [BATCH, CONTEXT]).to(device),
        Tensor::from_vec(y, [BATCH, CONTEXT]).to(device),
    )
}

fn loss_of(model: &Gpt, x: &Tensor, y: &Tensor) -> kiln::Result<Tensor> {
    let logits = model.forward(x)?;
    let v = logits.shape()[2];
    cross_entropy(
        &logits.try_reshape([(BATCH * CONTEXT) as isize, v as isize])?,
        &y.try_reshape([(BATCH * CONTEXT) as isize])?,
    )
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

struct Args {
    steps: u64,
    device: Device,
    checkpoint: Option<String>,
    resume: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        steps: 2000,
        device: Device::Cpu,
        checkpoint: None,
        resume: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--steps" => a.steps = value()?.parse().map_err(|e| format!("--steps: {e}"))?,
            "--device" => {
                a.device = match value()?.as_str() {
                    "cpu" => Device::Cpu,
                    "cuda" => Device::Cuda(0),
                    d => return Err(format!("--device {d}: use cpu or cuda")),
                }
            }
            "--checkpoint" => a.checkpoint = Some(value()?),
            "--resume" => a.resume = Some(value()?),
            f => return Err(format!("unknown option {f}")),
        }
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/tinyshakespeare.txt"
    ))?;
    let mut chars: Vec<char> = text.chars().collect();
    chars.sort_unstable();
    chars.dedup();
    let index = |c: char| chars.binary_search(&c).map(|i| i as i64).unwrap_or(0);
    let data: Vec<i64> = text.chars().map(index).collect();
    let cut = data.len() * 9 / 10;
    let (train, val) = (&data[..cut], &data[cut..]);
    let vocab = chars.len();

    let mut model = Gpt::new(vocab, 1337)?;
    if let Some(path) = &a.resume {
        kiln::io::safetensors::load_state_dict(&model, path)?;
        println!("resumed from {path}");
    }
    model.to_device(a.device)?;
    // Weight decay on matrices and embeddings, not on LayerNorm gains or biases.
    let (decay, no_decay): (Vec<_>, Vec<_>) = model
        .named_parameters()
        .into_iter()
        .partition(|(_, p)| p.ndim() >= 2);
    let decay: Vec<Tensor> = decay.into_iter().map(|(_, p)| p).collect();
    let no_decay: Vec<Tensor> = no_decay.into_iter().map(|(_, p)| p).collect();
    let adamw = AdamWOptions {
        lr: 3e-3,
        betas: (0.9, 0.99),
        eps: 1e-8,
        weight_decay: 0.1,
        ..Default::default()
    };
    // Two parameter groups, one optimizer: a step is one realize.
    let mut opt = AdamW::with_groups(vec![
        ParamGroup::new(decay, adamw),
        ParamGroup::new(
            no_decay,
            AdamWOptions {
                weight_decay: 0.0,
                ..adamw
            },
        ),
    ])?;
    let schedule = WarmupCosine {
        base: 3e-3,
        warmup: 100,
        total: 2000,
        min_ratio: 0.1,
    };
    let mut rng = Rng(0x5EED_1234_ABCD_0001);
    let mut first_step = 0;
    if let Some(path) = &a.resume {
        let train_state = format!("{path}.train");
        if std::path::Path::new(&train_state).exists() {
            (first_step, rng) = load_training_state(&mut opt, &train_state)?;
            println!("resumed training state from {train_state} at step {first_step}");
        }
    }
    let params = model.parameters();
    println!(
        "char_gpt: {} parameters, vocabulary {vocab}, {} train / {} val characters, device {}",
        model.num_parameters(),
        train.len(),
        val.len(),
        a.device
    );

    let step = |model: &Gpt, rng: &mut Rng, s: u64, opt: &mut AdamW| -> kiln::Result<f32> {
        let (x, y) = batch(train, rng, a.device);
        opt.zero_grad();
        let loss = loss_of(model, &x, &y)?;
        loss.backward()?;
        clip_grad_norm(&params, 1.0)?;
        opt.set_lr(schedule.lr(s));
        // Both groups' updates, the forward and backward pass, the clipping and the loss:
        // one realize.
        opt.step()?;
        loss.item::<f32>()
    };

    let mut times = vec![];
    let mut reserved_after_10 = 0;
    let start = Instant::now();
    for s in first_step..a.steps {
        let t = Instant::now();
        let loss = step(&model, &mut rng, s, &mut opt)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        if s + 1 == 10 {
            reserved_after_10 = memory::stats(a.device).reserved_bytes;
        }
        if (s + 1) % 250 == 0 || s == 0 {
            let val_loss = evaluate(&model, val, &mut Rng(77), 2, a.device)?;
            let recent = times.len().min(250);
            let mut window = times[times.len() - recent..].to_vec();
            println!(
                "step {} loss {loss:.4} val {val_loss:.4} ms/step {:.1}",
                s + 1,
                median(&mut window)
            );
        }
    }
    let reserved_last = memory::stats(a.device).reserved_bytes;
    let train_secs = start.elapsed().as_secs_f64();
    if let Some(path) = &a.checkpoint {
        kiln::io::safetensors::save_state_dict(&model, path)?;
        save_training_state(
            &opt,
            a.steps.max(first_step),
            &rng,
            &format!("{path}.train"),
        )?;
        println!("saved {path} and {path}.train");
    }
    if std::env::var_os("KILN_GPT_TRAIN_ONLY").is_some() {
        println!("step_ms: fused={:.1}", median(&mut times));
        return Ok(());
    }

    // Unfused steps for comparison (same model, same kind of step, one op per kernel).
    opt.set_realize_options(RealizeOptions::unfused());
    let mut unfused = vec![];
    for s in 0..20 {
        let t = Instant::now();
        step(&model, &mut rng, a.steps + s, &mut opt)?;
        unfused.push(t.elapsed().as_secs_f64() * 1e3);
    }

    let sample = generate(&model, &chars, &index, 300, a.device)?;
    println!("--- sample ---\n{sample}\n--------------");
    let val_loss = evaluate(&model, val, &mut Rng(2024), 10, a.device)?;
    println!("train_time_s: {train_secs:.1}");
    println!("val_loss: {val_loss:.4}");
    println!(
        "step_ms: fused={:.1} unfused={:.1}",
        median(&mut times),
        median(&mut unfused)
    );
    println!("reserved_bytes: after_step_10={reserved_after_10} after_last_step={reserved_last}");
    Ok(())
}

/// Saves the optimizer's state dict (names prefixed `optim.`), the step reached and the
/// sampler's state.
fn save_training_state(opt: &AdamW, step: u64, rng: &Rng, path: &str) -> kiln::Result<()> {
    let mut state: Vec<(String, Tensor)> = opt
        .state_dict()?
        .into_iter()
        .map(|(n, t)| (format!("optim.{n}"), t))
        .collect();
    state.push(("train.step".into(), Tensor::scalar(step as i64)));
    // The sampler's 64 bits, kept as they are in an i64.
    state.push(("train.rng".into(), Tensor::scalar(rng.0 as i64)));
    let named: Vec<(&str, &Tensor)> = state.iter().map(|(n, t)| (n.as_str(), t)).collect();
    kiln::io::save(&named, path)
}

/// Restores what [`save_training_state`] saved into `opt`; returns the step reached and
/// the sampler.
fn load_training_state(opt: &mut AdamW, path: &str) -> kiln::Result<(u64, Rng)> {
    let mut optim = vec![];
    let (mut step, mut rng) = (None, None);
    for (name, t) in kiln::io::load(path)? {
        match name.as_str() {
            "train.step" => step = Some(t.item::<i64>()?),
            "train.rng" => rng = Some(t.item::<i64>()?),
            _ => optim.push((name.strip_prefix("optim.").unwrap_or(&name).to_string(), t)),
        }
    }
    opt.load_state_dict(&optim)?;
    match (step, rng) {
        (Some(step), Some(rng)) if step >= 0 => Ok((step as u64, Rng(rng as u64))),
        _ => Err(kiln::KilnError::InvalidArgument {
            op: "char_gpt --resume",
            shape: vec![],
            reason: format!("{path} lacks train.step or train.rng"),
        }),
    }
}

/// Mean loss over `batches` validation batches.
fn evaluate(
    model: &Gpt,
    val: &[i64],
    rng: &mut Rng,
    batches: usize,
    device: Device,
) -> kiln::Result<f64> {
    let mut total = 0.0;
    for _ in 0..batches {
        let (x, y) = batch(val, rng, device);
        total += no_grad(|| loss_of(model, &x, &y))?.item::<f32>()? as f64;
    }
    Ok(total / batches as f64)
}

/// `n` characters sampled from the model (temperature 1), starting from a newline.
fn generate(
    model: &Gpt,
    chars: &[char],
    index: &dyn Fn(char) -> i64,
    n: usize,
    device: Device,
) -> kiln::Result<String> {
    let mut rng = Rng(0xC0FF_EE00_1234_5678);
    let mut ctx: Vec<i64> = vec![index('\n')];
    let mut out = String::new();
    for _ in 0..n {
        let window = &ctx[ctx.len().saturating_sub(CONTEXT)..];
        let ids = Tensor::from_vec(window.to_vec(), [1, window.len()]).to(device);
        let probs = no_grad(|| {
            let logits = model.forward(&ids)?;
            let last =
                logits.try_slice_dim(1, window.len() as isize - 1, window.len() as isize, 1)?;
            last.try_softmax(-1)?.try_cast(DType::F64)
        })?
        .to_vec::<f64>()?;
        let mut u = rng.uniform();
        let mut pick = probs.len() - 1;
        for (i, p) in probs.iter().enumerate() {
            if u < *p {
                pick = i;
                break;
            }
            u -= p;
        }
        ctx.push(pick as i64);
        out.push(chars[pick]);
    }
    Ok(out)
}
