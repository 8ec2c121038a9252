//! PyTorch subscripts, `x[...]` as `x.i(...)` and `x[...] = v` as `x.i_put(...)`/`i_put_`:
//! hand-computed cases of PyTorch's rules (integers first, then index tensors placed where
//! they stood when adjacent and first otherwise), the errors, and random subscripts over
//! random shapes checked against a plain-loop oracle (values, gradients and writes).

use kiln::{Index, KilnError, Tensor};

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

fn arange(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec((0..n).map(|v| v as f32).collect::<Vec<_>>(), shape)
}

/// Hand-computed results of PyTorch's indexing rules.
#[test]
fn subscripts_follow_pytorch_rules() {
    let x = arange(&[2, 3, 4]);
    // Basic: x[1, :, -1], x[:, 1:3, ::2], x[..., None], x[None, 0].
    assert_eq!(f32s(&x.i((1, .., -1))), vec![15.0, 19.0, 23.0]);
    let s = x.i((.., 1..3, Index::stepped(.., 2)));
    assert_eq!(s.shape(), &[2, 2, 2]);
    assert_eq!(f32s(&s), vec![4.0, 6.0, 8.0, 10.0, 16.0, 18.0, 20.0, 22.0]);
    assert_eq!(
        x.i((Index::Ellipsis, Index::NewAxis)).shape(),
        &[2, 3, 4, 1]
    );
    assert_eq!(x.i((Index::NewAxis, 0)).shape(), &[1, 3, 4]);
    // One entry needs no tuple.
    assert_eq!(x.i(1).shape(), &[3, 4]);
    assert_eq!(x.i(0..1).shape(), &[1, 3, 4]);
    assert_eq!(x.i(..).shape(), &[2, 3, 4]);
    assert_eq!(
        f32s(&x.i((Index::Ellipsis, 1))),
        vec![1.0, 5.0, 9.0, 13.0, 17.0, 21.0]
    );
    // Bounds clamp as Python's slices do; inclusive ends count from the end too.
    assert_eq!(x.i((.., -10..10)).shape(), &[2, 3, 4]);
    assert_eq!(x.i((.., 5..)).shape(), &[2, 0, 4]);
    assert_eq!(f32s(&x.i((0, 0, 1..=2))), vec![1.0, 2.0]);
    assert_eq!(f32s(&x.i((0, 0, ..=-2))), vec![0.0, 1.0, 2.0]);
    // One index tensor: x[idx] picks rows; x[:, idx] keeps the dimension in place.
    let idx = Tensor::from_vec(vec![2i64, 0], [2]);
    let rows = x.i((0, &idx));
    assert_eq!(f32s(&rows), vec![8.0, 9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 3.0]);
    let cols = x.i((.., &idx));
    assert_eq!(cols.shape(), &[2, 2, 4]);
    assert_eq!(f32s(&cols.i((1, 0))), vec![20.0, 21.0, 22.0, 23.0]);
    // x[0, :, idx]: the integer goes first (PyTorch), so the result is [3, 2], not
    // NumPy's [2, 3].
    let mixed = x.i((0, .., &idx));
    assert_eq!(mixed.shape(), &[3, 2]);
    assert_eq!(f32s(&mixed), vec![2.0, 0.0, 6.0, 4.0, 10.0, 8.0]);
    // Two adjacent index tensors broadcast together and stay in place: x[:, i, j].
    let i = Tensor::from_vec(vec![0i64, 2], [2, 1]);
    let j = Tensor::from_vec(vec![1i64, -1, 0], [3]);
    let p = x.i((.., &i, &j));
    assert_eq!(p.shape(), &[2, 2, 3]);
    assert_eq!(
        f32s(&p),
        vec![
            1.0, 3.0, 0.0, 9.0, 11.0, 8.0, 13.0, 15.0, 12.0, 21.0, 23.0, 20.0
        ]
    );
    // Separated by a slice: the broadcast dimensions go first, x[i, :, j] is [2, 3, 3].
    let i01 = Tensor::from_vec(vec![0i64, 1], [2, 1]);
    let q = x.i((&i01, .., &j));
    assert_eq!(q.shape(), &[2, 3, 3]);
    // q[b0, b1] = x[i[b0], :, j[b1]].
    assert_eq!(f32s(&q.i((1, 2))), vec![12.0, 16.0, 20.0]);
    assert_eq!(f32s(&q.i((1, .., 2))), vec![21.0, 23.0, 20.0]);
    // A bool mask over two dimensions (realized when called), then a slice.
    let m = x.i((.., .., 0)).gt(10.0);
    let sel = x.i((&m, 1..3));
    assert_eq!(sel.shape(), &[3, 2]);
    assert_eq!(f32s(&sel), vec![13.0, 14.0, 17.0, 18.0, 21.0, 22.0]);
    // Views of a view, and the index tensor's own shape in front.
    let t = x.permute([2, 1, 0]);
    assert_eq!(t.shape(), &[4, 3, 2]);
    let grid = Tensor::from_vec(vec![3i64, 0, 1, 1], [2, 2]);
    let g = t.i((&grid, 1, 0));
    assert_eq!(g.shape(), &[2, 2]);
    assert_eq!(f32s(&g), vec![7.0, 4.0, 5.0, 5.0]);
}

/// Writes: the places the read would read take the values, out of place and in place.
#[test]
fn i_put_writes_where_the_read_reads() {
    let x = Tensor::zeros([3, 4]);
    let y = x.i_put((.., Index::stepped(.., 2)), &Tensor::scalar(1.0f32));
    assert_eq!(
        f32s(&y),
        vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    );
    let idx = Tensor::from_vec(vec![2i64, 0, 2], [3]);
    let v = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]);
    // x[idx, 1:3] = v: row 2 is written twice, the last write wins.
    let z = x.i_put((&idx, 1..3), &v);
    assert_eq!(
        f32s(&z),
        vec![0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 6.0, 0.0]
    );
    // In place, with a mask: the tensor's own handle sees it.
    let w = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], [2, 2]);
    let neg = w.lt(0.0);
    w.i_put_(&neg, &Tensor::scalar(0.0f32));
    assert_eq!(f32s(&w), vec![1.0, 0.0, 3.0, 0.0]);
    w.i_put_((1, ..), &Tensor::from_vec(vec![8.0f32, 9.0], [2]));
    assert_eq!(f32s(&w), vec![1.0, 0.0, 8.0, 9.0]);
    // Gradients: values get the gradient at their places, x everywhere else.
    let a = Tensor::ones([2, 3]).requires_grad_(true);
    let b = Tensor::from_vec(vec![5.0f32, 6.0], [2]).requires_grad_(true);
    let out = a.i_put((.., 1), &b);
    let weights = arange(&[2, 3]);
    (&out * &weights).sum(..).backward().unwrap();
    assert_eq!(f32s(&a.grad().unwrap()), vec![0.0, 0.0, 2.0, 3.0, 0.0, 5.0]);
    assert_eq!(f32s(&b.grad().unwrap()), vec![1.0, 4.0]);
}

/// Bad subscripts fail when recorded (or, for an index tensor's value, when realized),
/// naming the shape.
#[test]
fn bad_subscripts_are_typed_errors() {
    let x = arange(&[2, 3]);
    let err = x.try_i((0, 0, 0)).unwrap_err();
    assert!(matches!(err, KilnError::InvalidArgument { .. }));
    assert!(err.to_string().contains("too many indices"), "{err}");
    let err = x.try_i((Index::Ellipsis, Index::Ellipsis)).unwrap_err();
    assert!(err.to_string().contains("single ellipsis"), "{err}");
    let err = x.try_i((.., 3)).unwrap_err();
    assert!(
        err.to_string()
            .contains("out of bounds for dimension 1 with size 3"),
        "{err}"
    );
    assert!(x.try_i((.., -4)).is_err());
    let err = x.try_i(Index::stepped(.., 0)).unwrap_err();
    assert!(err.to_string().contains("step"), "{err}");
    let err = x.try_i(Tensor::from_vec(vec![1.0f32], [1])).unwrap_err();
    assert!(matches!(err, KilnError::UnsupportedDType { .. }), "{err}");
    let err = x
        .try_i(Tensor::from_vec(vec![true, false], [2, 1]))
        .unwrap_err();
    assert!(matches!(err, KilnError::ShapeMismatch { .. }), "{err}");
    // Index tensors that do not broadcast together.
    let (two, three) = (
        Tensor::from_vec(vec![0i64, 1], [2]),
        Tensor::from_vec(vec![0i64, 1, 2], [3]),
    );
    let err = x.try_i((&two, &three)).unwrap_err();
    assert!(matches!(err, KilnError::ShapeMismatch { .. }), "{err}");
    let big = Tensor::from_vec(vec![0i64, 5], [2]);
    let err = x.i((.., &big)).to_vec::<f32>().unwrap_err();
    assert!(matches!(err, KilnError::IndexOutOfRange { .. }), "{err}");
    let err = x
        .try_i_put((0, ..), &Tensor::from_vec(vec![1i64, 2, 3], [3]))
        .unwrap_err();
    assert!(matches!(err, KilnError::DTypeMismatch { .. }), "{err}");
}

// ---------------------------------------------------------------------------
// A plain-loop oracle over random subscripts.
// ---------------------------------------------------------------------------

/// A linear congruential generator (the oracle needs no statistics).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

/// A subscript entry as the oracle sees it.
#[derive(Clone, Debug)]
enum E {
    At(i64),
    Slice(Option<i64>, Option<i64>, i64),
    New,
    Ellipsis,
    Ints(Vec<i64>, Vec<usize>),
    Mask(Vec<bool>, Vec<usize>),
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        out[d] = i % shape[d];
        i /= shape[d];
    }
    out
}

/// Python's slice positions over a dimension of `n`.
fn slice_positions(n: usize, start: Option<i64>, end: Option<i64>, step: i64) -> Vec<usize> {
    let n = n as i64;
    let norm = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) };
    let (s, e) = (norm(start.unwrap_or(0)), norm(end.unwrap_or(n)));
    (s..e.max(s))
        .step_by(step as usize)
        .map(|v| v as usize)
        .collect()
}

/// The flat position in a tensor of `shape` that each element of `x[entries]` reads, and
/// the result's shape: plain loops, one axis at a time.
/// `None` where the index tensors do not broadcast together.
fn oracle(shape: &[usize], entries: &[E]) -> Option<(Vec<usize>, Vec<usize>)> {
    // Each axis of the basic result: the source positions along one source dimension
    // (None for a new axis); integers fix a source coordinate.
    let consumed: usize = entries
        .iter()
        .map(|e| match e {
            E::At(_) | E::Slice(..) | E::Ints(..) => 1,
            E::Mask(_, s) => s.len(),
            _ => 0,
        })
        .sum();
    let mut fixed: Vec<Option<usize>> = vec![None; shape.len()];
    // (source dim or None, positions)
    let mut axes: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
    // (axis index in `axes`, index values over the broadcast) per advanced index
    let mut adv: Vec<(usize, Vec<i64>, Vec<usize>)> = Vec::new();
    let mut d = 0;
    let whole = |d: usize| (Some(d), (0..shape[d]).collect::<Vec<_>>());
    for e in entries {
        match e {
            E::At(i) => {
                let n = shape[d] as i64;
                fixed[d] = Some(if *i < 0 { i + n } else { *i } as usize);
                d += 1;
            }
            E::Slice(s, t, st) => {
                axes.push((Some(d), slice_positions(shape[d], *s, *t, *st)));
                d += 1;
            }
            E::New => axes.push((None, vec![0])),
            E::Ellipsis => {
                for _ in 0..shape.len() - consumed {
                    axes.push(whole(d));
                    d += 1;
                }
            }
            E::Ints(v, s) => {
                adv.push((axes.len(), v.clone(), s.clone()));
                axes.push(whole(d));
                d += 1;
            }
            E::Mask(bits, s) => {
                let hits: Vec<Vec<usize>> = bits
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b)
                    .map(|(i, _)| unravel(i, s))
                    .collect();
                for c in 0..s.len() {
                    let col: Vec<i64> = hits.iter().map(|h| h[c] as i64).collect();
                    let len = col.len();
                    adv.push((axes.len(), col, vec![len]));
                    axes.push(whole(d));
                    d += 1;
                }
            }
        }
    }
    while d < shape.len() {
        axes.push(whole(d));
        d += 1;
    }
    let src_strides = strides(shape);
    let base: usize = fixed
        .iter()
        .zip(&src_strides)
        .map(|(f, s)| f.unwrap_or(0) * s)
        .sum();
    // Broadcast shape of the advanced indices (NumPy's rule, right-aligned).
    let mut bshape: Vec<usize> = Vec::new();
    for (_, _, s) in &adv {
        let r = bshape.len().max(s.len());
        let mut out = vec![1; r];
        for k in 0..r {
            let a = if k + bshape.len() >= r {
                bshape[k + bshape.len() - r]
            } else {
                1
            };
            let b = if k + s.len() >= r {
                s[k + s.len() - r]
            } else {
                1
            };
            if a != 1 && b != 1 && a != b {
                return None;
            }
            out[k] = if a == 1 { b } else { a };
        }
        bshape = out;
    }
    let adv_axes: Vec<usize> = adv.iter().map(|a| a.0).collect();
    let rest: Vec<usize> = (0..axes.len()).filter(|a| !adv_axes.contains(a)).collect();
    let adjacent = adv_axes.windows(2).all(|w| w[1] == w[0] + 1);
    // Result axes: ("b", k) for broadcast dim k, ("r", axis) for a kept axis.
    let mut layout: Vec<(bool, usize)> = Vec::new();
    if adv.is_empty() {
        layout.extend(rest.iter().map(|&a| (false, a)));
    } else if adjacent {
        let first = adv_axes[0];
        layout.extend(rest.iter().filter(|&&a| a < first).map(|&a| (false, a)));
        layout.extend((0..bshape.len()).map(|k| (true, k)));
        layout.extend(rest.iter().filter(|&&a| a > first).map(|&a| (false, a)));
    } else {
        layout.extend((0..bshape.len()).map(|k| (true, k)));
        layout.extend(rest.iter().map(|&a| (false, a)));
    }
    let out_shape: Vec<usize> = layout
        .iter()
        .map(|&(b, k)| if b { bshape[k] } else { axes[k].1.len() })
        .collect();
    let total: usize = out_shape.iter().product();
    let mut places = Vec::with_capacity(total);
    for o in 0..total {
        let oi = unravel(o, &out_shape);
        let mut bi = vec![0; bshape.len()];
        let mut pos_in_axis = vec![0usize; axes.len()];
        for (k, &(b, a)) in layout.iter().enumerate() {
            if b {
                bi[a] = oi[k];
            } else {
                pos_in_axis[a] = oi[k];
            }
        }
        for (a, v, s) in &adv {
            // The index element at broadcast position `bi` (right-aligned, size-1 repeats).
            let off = bshape.len() - s.len();
            let idx_pos: Vec<usize> = (0..s.len())
                .map(|k| if s[k] == 1 { 0 } else { bi[off + k] })
                .collect();
            let flat: usize = idx_pos.iter().zip(strides(s)).map(|(p, st)| p * st).sum();
            let n = axes[*a].1.len() as i64;
            let i = v[flat];
            pos_in_axis[*a] = if i < 0 { i + n } else { i } as usize;
        }
        let mut place = base;
        for (a, (src, pos)) in axes.iter().enumerate() {
            if let Some(dim) = src {
                place += pos[pos_in_axis[a]] * src_strides[*dim];
            }
        }
        places.push(place);
    }
    Some((places, out_shape))
}

/// A random subscript for `shape` (consuming at most its dimensions).
fn random_subscript(rng: &mut Rng, shape: &[usize]) -> Option<Vec<E>> {
    let mut entries = Vec::new();
    let mut d = 0;
    let mut ellipsis = None;
    // The advanced indices share a broadcast shape `bs`; each takes it with some sizes 1.
    let bs: Vec<usize> = (0..rng.below(3)).map(|_| 1 + rng.below(3)).collect();
    while d < shape.len() && rng.below(5) != 0 {
        let n = shape[d] as i64;
        match rng.below(8) {
            0 | 1 => {
                entries.push(E::At(rng.below(2 * n as usize) as i64 - n));
                d += 1;
            }
            2 | 3 => {
                let b = |r: &mut Rng| match r.below(3) {
                    0 => None,
                    _ => Some(r.below(2 * n as usize + 3) as i64 - n - 1),
                };
                let (s, e) = (b(rng), b(rng));
                entries.push(E::Slice(s, e, 1 + rng.below(3) as i64));
                d += 1;
            }
            4 => entries.push(E::New),
            5 if ellipsis.is_none() => {
                entries.push(E::Ellipsis);
                // Leave the ellipsis a random number of dimensions.
                let skip = rng.below(shape.len() - d + 1);
                ellipsis = Some(skip);
                d += skip;
            }
            6 if d + 2 <= shape.len() && rng.below(3) == 0 => {
                let s = vec![shape[d], shape[d + 1]];
                let bits = (0..s[0] * s[1]).map(|_| rng.below(2) == 0).collect();
                entries.push(E::Mask(bits, s));
                d += 2;
            }
            _ => {
                let drop = rng.below(bs.len() + 1);
                let s: Vec<usize> = bs
                    .iter()
                    .map(|&b| if rng.below(3) == 0 { 1 } else { b })
                    .collect::<Vec<_>>()
                    .split_off(drop);
                let count: usize = s.iter().product();
                let v = (0..count)
                    .map(|_| rng.below(2 * n as usize) as i64 - n)
                    .collect();
                entries.push(E::Ints(v, s));
                d += 1;
            }
        }
    }
    // The ellipsis stands for what the other entries leave: keep the subscript only where
    // that is what it skipped (the later entries were drawn for those dimensions).
    match ellipsis {
        Some(skip) if skip != shape.len() - (d - skip) => None,
        _ => Some(entries),
    }
}

fn to_index(e: &E) -> Index {
    match e {
        E::At(i) => Index::At(*i),
        E::Slice(s, t, st) => Index::Slice {
            start: *s,
            end: *t,
            step: *st,
        },
        E::New => Index::NewAxis,
        E::Ellipsis => Index::Ellipsis,
        E::Ints(v, s) => Index::Tensor(Tensor::from_vec(v.clone(), s.as_slice())),
        E::Mask(b, s) => Index::Tensor(Tensor::from_vec(b.clone(), s.as_slice())),
    }
}

/// Random subscripts over random (and permuted) shapes: values, gradients and writes
/// against the oracle's places.
#[test]
fn random_subscripts_match_the_oracle() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut checked = 0;
    let mut advanced = 0;
    let mut mismatched = 0;
    for _ in 0..600 {
        let ndim = 1 + rng.below(4);
        let shape: Vec<usize> = (0..ndim).map(|_| 1 + rng.below(4)).collect();
        let Some(entries) = random_subscript(&mut rng, &shape) else {
            continue;
        };
        let subs: Vec<Index> = entries.iter().map(to_index).collect();
        let Some((places, out_shape)) = oracle(&shape, &entries) else {
            let x = Tensor::zeros(shape.as_slice());
            let err = x.try_i(subs).unwrap_err();
            assert!(matches!(err, KilnError::ShapeMismatch { .. }), "{err}");
            mismatched += 1;
            continue;
        };
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|v| v as f32 * 0.5 - 3.0).collect();
        // Half of the time read through a permuted view: the leaf holds the data in
        // reversed dimension order, and `x` is its permutation back.
        let permuted = ndim > 1 && rng.below(2) == 0;
        let rev: Vec<isize> = (0..ndim as isize).rev().collect();
        let leaf = if permuted {
            let rshape: Vec<usize> = shape.iter().rev().copied().collect();
            let rdata: Vec<f32> = (0..n)
                .map(|k| {
                    let mut at = unravel(k, &rshape);
                    at.reverse();
                    let p: usize = at.iter().zip(strides(&shape)).map(|(a, s)| a * s).sum();
                    data[p]
                })
                .collect();
            Tensor::from_vec(rdata, rshape.as_slice())
        } else {
            Tensor::from_vec(data.clone(), shape.as_slice())
        }
        .requires_grad_(true);
        let x = if permuted {
            leaf.permute(rev.clone())
        } else {
            leaf.clone()
        };
        let y = x.i(subs.clone());
        assert_eq!(y.shape(), out_shape.as_slice(), "{entries:?} on {shape:?}");
        let want: Vec<f32> = places.iter().map(|&p| data[p]).collect();
        assert_eq!(f32s(&y), want, "{entries:?} on {shape:?}");
        // Gradient of sum(y * w): w summed into each read place.
        let m = places.len();
        let w: Vec<f32> = (0..m).map(|k| (k % 7) as f32 + 1.0).collect();
        let wt = Tensor::from_vec(w.clone(), out_shape.as_slice());
        (&y * &wt).sum(..).backward().unwrap();
        let mut g = vec![0.0f32; n];
        for (&p, &wk) in places.iter().zip(&w) {
            g[p] += wk;
        }
        let grad = leaf.grad().unwrap();
        let grad = if permuted { grad.permute(rev) } else { grad };
        assert_eq!(f32s(&grad), g, "grad {entries:?} on {shape:?}");
        // Write: the last value for a place wins.
        let v: Vec<f32> = (0..m).map(|k| 100.0 + k as f32).collect();
        let vt = Tensor::from_vec(v.clone(), out_shape.as_slice());
        let put = x.detach().i_put(subs, &vt);
        let mut expect = data.clone();
        for (&p, &vk) in places.iter().zip(&v) {
            expect[p] = vk;
        }
        assert_eq!(f32s(&put), expect, "put {entries:?} on {shape:?}");
        checked += 1;
        if entries
            .iter()
            .any(|e| matches!(e, E::Ints(..) | E::Mask(..)))
        {
            advanced += 1;
        }
    }
    println!("{checked} checked, {advanced} advanced, {mismatched} not broadcastable");
    assert!(
        checked > 400 && advanced > 120,
        "{checked} checked, {advanced} advanced, {mismatched} not broadcastable"
    );
}

#[test]
fn zero_dimensional_bool_indices_add_a_dimension() {
    // NumPy's (and PyTorch's) results for x = arange(12).reshape(3, 4).
    let x = arange(&[3, 4]);
    let all: Vec<f32> = (0..12).map(|v| v as f32).collect();
    assert_eq!(x.i(true).shape(), &[1, 3, 4]);
    assert_eq!(f32s(&x.i(true)), all);
    assert_eq!(x.i(false).shape(), &[0, 3, 4]);
    assert_eq!(x.i(Tensor::scalar(true)).shape(), &[1, 3, 4]);
    assert_eq!(x.i((.., true)).shape(), &[3, 1, 4]);
    assert_eq!(f32s(&x.i((.., true))), all);
    assert_eq!(x.i((0, true)).shape(), &[1, 4]);
    assert_eq!(f32s(&x.i((0, true))), vec![0.0, 1.0, 2.0, 3.0]);
    // With index tensors it broadcasts as a length-1 index of its new dimension.
    let rows = Tensor::from_vec(vec![0i64, 1], [2]);
    let first_two: Vec<f32> = (0..8).map(|v| v as f32).collect();
    assert_eq!(x.i((true, &rows)).shape(), &[2, 4]);
    assert_eq!(f32s(&x.i((true, &rows))), first_two);
    assert_eq!(x.i((&rows, true)).shape(), &[2, 4]);
    assert_eq!(f32s(&x.i((&rows, true))), first_two);
    let cols = Tensor::from_vec(vec![1i64, 2], [2]);
    let picked = x.i((Index::Ellipsis, true, &cols));
    assert_eq!(picked.shape(), &[3, 2]);
    assert_eq!(f32s(&picked), vec![1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
    // `x[False, rows]` cannot broadcast a length-0 index with a length-2 one.
    assert!(matches!(
        x.try_i((false, &rows)).unwrap_err(),
        KilnError::ShapeMismatch { .. }
    ));
    // Writes: `x[True] = 1` fills everything, `x[False] = 1` nothing.
    let y = x.i_put(true, &Tensor::ones([1]));
    assert_eq!(f32s(&y), vec![1.0; 12]);
    assert_eq!(f32s(&x.i_put(false, &Tensor::ones([1]))), all);
}
