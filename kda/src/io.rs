//! Problems and results as safetensors files, in the contract's layouts
//! (docs/CONTRACT.md#files).
//!
//! An input file holds `k`, `w`, `u` (bf16), `gk` (f32), optionally `h0` (f32, `[N, H, K, V]`)
//! and `cu_seqlens` (i32 or i64). Token tensors are `[T, H, D]`; a leading batch dimension is
//! accepted: `[1, T, H, D]` with or without `cu_seqlens`, `[B, T, H, D]` only without (a dense
//! batch of `B` equal sequences). Without `cu_seqlens` and without a batch dimension the file is
//! one sequence. A file that also holds `h`, `v_new` and `ht` (as the golden fixtures do) returns
//! them as the expected outputs.
//!
//! ```
//! use kda::{inputs, io, reference, Plan};
//! let dir = std::env::temp_dir().join(format!("kda-io-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let p = inputs::random_problem(Plan::from_lengths(&[3, 0, 70]), 2, true, 9);
//! let out = reference::reference(&p).unwrap();
//! io::write_problem(&dir.join("case.safetensors"), &p, Some(&out)).unwrap();
//! let (back, expected) = io::read_problem(&dir.join("case.safetensors")).unwrap();
//! assert_eq!(back.plan, p.plan);
//! assert_eq!(expected.unwrap(), out);
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

use crate::model::{Gates, ModelProblem, ModelShape, ModelView, StateLayout};
use crate::{Dims, KdaError, Outputs, Plan, Problem, Tensor};
use half::bf16;
use kda_kernel::layout::{K_DIM, V_DIM};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::collections::HashMap;
use std::path::Path;

/// Reads a problem (and the expected outputs, when the file holds them) from `path`.
///
/// ```
/// use kda::{Plan, inputs, io, reference};
/// let p = inputs::try_random_problem(Plan::from_lengths(&[70, 0]), 2, true, 3)?;
/// let path = std::env::temp_dir().join(format!("kda-doc-{}.safetensors", std::process::id()));
/// io::write_problem(&path, &p, Some(&reference::reference(&p)?))?;
/// let (back, outputs) = io::read_problem(&path)?;
/// assert_eq!((back.k, back.h0, back.plan.lengths()), (p.k, p.h0, vec![70, 0]));
/// assert!(outputs.is_some());
/// # std::fs::remove_file(&path).unwrap();
/// # Ok::<(), kda::KdaError>(())
/// ```
pub fn read_problem(path: &Path) -> Result<(Problem, Option<Outputs>), KdaError> {
    let bytes = std::fs::read(path).map_err(|source| io_error(path, source))?;
    parse_problem(&bytes, &path.display().to_string())
}

/// Parses a problem from the bytes of a safetensors file; `origin` names it in errors.
pub fn parse_problem(bytes: &[u8], origin: &str) -> Result<(Problem, Option<Outputs>), KdaError> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| KdaError::Safetensors { path: origin.into(), reason: e.to_string() })?;
    // A file of the generalized recurrence is not silently read as a KDA one.
    if optional(&file, "g").is_some() {
        let reason = "the scalar gate `g` is part of the generalized recurrence (io::read_model_problem)".into();
        return Err(KdaError::Unsupported { argument: "g", reason });
    }
    if metadata_entry(bytes, origin, "state_layout")?.is_some_and(|l| l != "[K, V]") {
        let reason = "a value-first state is part of the generalized recurrence (io::read_model_problem)".into();
        return Err(KdaError::Unsupported { argument: "state_layout", reason });
    }
    let k = require(&file, Tensor::K)?;
    let (batch, tokens, heads) = token_dims(Tensor::K, k.shape(), K_DIM)?;
    if heads == 0 {
        return Err(KdaError::Argument { name: "heads", reason: "k has H = 0 heads; must be at least 1".into() });
    }
    // Value heads from `w` (`[.., T, HV, K]`); its full shape is checked below.
    let (_, _, value_heads) = token_dims(Tensor::W, require(&file, Tensor::W)?.shape(), K_DIM)?;
    let plan = match optional(&file, "cu_seqlens") {
        Some(cu) => plan_from_cu_seqlens(&cu, batch, tokens)?,
        None => Plan::try_dense(batch, tokens)?,
    };
    let lead: Vec<usize> = if k.shape().len() == 4 { vec![batch, tokens] } else { vec![tokens] };
    let token_shape = |heads: usize, d: usize| [lead.as_slice(), &[heads, d]].concat();
    let dims = Dims::grouped(&plan, heads, value_heads);
    // Outputs of these sizes must be allocatable (a dense file of empty sequences holds no data
    // but may name a huge batch).
    dims.check()?;
    let state_shape = dims.shape_of(Tensor::Ht);

    let k = bf16_values(Tensor::K, &k, &token_shape(heads, K_DIM))?;
    let w = bf16_values(Tensor::W, &require(&file, Tensor::W)?, &token_shape(value_heads, K_DIM))?;
    let u = bf16_values(Tensor::U, &require(&file, Tensor::U)?, &token_shape(value_heads, V_DIM))?;
    let gk = f32_values(Tensor::Gk, &require(&file, Tensor::Gk)?, &token_shape(value_heads, K_DIM))?;
    let h0 = optional(&file, Tensor::H0.name()).map(|t| f32_values(Tensor::H0, &t, &state_shape)).transpose()?;
    let problem = Problem { plan, heads, value_heads, k, w, u, gk, h0 };

    let outputs = [Tensor::H, Tensor::VNew, Tensor::Ht].map(|t| optional(&file, t.name()));
    let expected = match outputs {
        [Some(h), Some(v_new), Some(ht)] => {
            let h_shape = dims.shape_of(Tensor::H);
            // Producers that keep a batch dimension write `h` as `[1, NT, H, K, V]`.
            let h_shape = if h.shape().len() == 5 { [&[1], h_shape.as_slice()].concat() } else { h_shape };
            Some(Outputs {
                h: bf16_values(Tensor::H, &h, &h_shape)?,
                v_new: bf16_values(Tensor::VNew, &v_new, &token_shape(value_heads, V_DIM))?,
                ht: f32_values(Tensor::Ht, &ht, &state_shape)?,
            })
        }
        _ => None,
    };
    Ok((problem, expected))
}

/// Reads a generalized problem (docs/CONTRACT.md#the-generalized-recurrence), and the expected
/// outputs when the file holds them: `k` `[T, H, K]`, `w` `[T, HV, K]`, `u` `[T, HV, V]` (bf16),
/// `g` `[T, HV]` and/or `gk` `[T, HV, K]` (f32; either, both or neither), `cu_seqlens`, optional
/// `h0`; outputs `h`, `v_new`, `ht`. The state layout is the metadata entry `state_layout`
/// (`"[K, V]"` or `"[V, K]"`); without it, key-first.
pub fn read_model_problem(path: &Path) -> Result<(ModelProblem, Option<Outputs>), KdaError> {
    let bytes = std::fs::read(path).map_err(|source| io_error(path, source))?;
    parse_model_problem(&bytes, &path.display().to_string())
}

/// Parses a generalized problem from the bytes of a safetensors file; `origin` names it in errors.
pub fn parse_model_problem(bytes: &[u8], origin: &str) -> Result<(ModelProblem, Option<Outputs>), KdaError> {
    let bad_file = |reason: String| KdaError::Safetensors { path: origin.into(), reason };
    let file = SafeTensors::deserialize(bytes).map_err(|e| bad_file(e.to_string()))?;
    let layout = match metadata_entry(bytes, origin, "state_layout")?.as_deref() {
        None | Some("[K, V]") => StateLayout::KeyFirst,
        Some("[V, K]") => StateLayout::ValueFirst,
        Some(other) => return Err(bad_file(format!("state_layout `{other}`: expected `[K, V]` or `[V, K]`"))),
    };
    let dims3 = |name: &'static str| -> Result<[usize; 3], KdaError> {
        let t = file.tensor(name).map_err(|_| KdaError::MissingTensor { tensor: name })?;
        t.shape().try_into().map_err(|_| KdaError::Shape {
            tensor: name,
            expected: "[T, heads, size]".into(),
            expected_len: 0,
            actual: format!("shape {:?}", t.shape()),
        })
    };
    let ([tokens, heads, key_dim], [_, value_heads, _], [_, _, value_dim]) = (dims3("k")?, dims3("w")?, dims3("u")?);
    let gates = Gates { g: optional(&file, "g").is_some(), gk: optional(&file, "gk").is_some() };
    let shape = ModelShape { heads, value_heads, key_dim, value_dim, gates, layout };
    shape.validate()?;
    let plan = match optional(&file, "cu_seqlens") {
        Some(cu) => plan_from_cu_seqlens(&cu, 1, tokens)?,
        None => Plan::try_dense(1, tokens)?,
    };
    let state = |lead: usize| match layout {
        StateLayout::KeyFirst => vec![lead, value_heads, key_dim, value_dim],
        StateLayout::ValueFirst => vec![lead, value_heads, value_dim, key_dim],
    };
    let bf16_tensor = |name: &'static str, dims: &[usize]| -> Result<Vec<bf16>, KdaError> {
        let view = file.tensor(name).map_err(|_| KdaError::MissingTensor { tensor: name })?;
        Ok(bf16_of(checked_named(name, Stored::Bf16, &view, dims)?))
    };
    let f32_tensor = |name: &'static str, dims: &[usize]| -> Result<Option<Vec<f32>>, KdaError> {
        let Some(view) = optional(&file, name) else { return Ok(None) };
        Ok(Some(f32_of(checked_named(name, Stored::F32, &view, dims)?)))
    };
    let problem = ModelProblem {
        shape,
        k: bf16_tensor("k", &[tokens, heads, key_dim])?,
        w: bf16_tensor("w", &[tokens, value_heads, key_dim])?,
        u: bf16_tensor("u", &[tokens, value_heads, value_dim])?,
        g: f32_tensor("g", &[tokens, value_heads])?,
        gk: f32_tensor("gk", &[tokens, value_heads, key_dim])?,
        h0: f32_tensor("h0", &state(plan.num_seqs()))?,
        plan,
    };
    problem.view().validate()?;
    let expected = match ["h", "v_new", "ht"].map(|t| optional(&file, t)) {
        [Some(_), Some(_), Some(_)] => Some(Outputs {
            h: bf16_tensor("h", &state(problem.plan.chunks()))?,
            v_new: bf16_tensor("v_new", &[tokens, value_heads, value_dim])?,
            ht: f32_tensor("ht", &state(problem.plan.num_seqs()))?.unwrap_or_default(),
        }),
        _ => None,
    };
    Ok((problem, expected))
}

/// Reads the outputs `h`, `v_new` and `ht` of a problem of sizes `dims` from `path` (a file
/// [`write_outputs`] or `kda run` wrote, or a fixture that holds outputs).
pub fn read_outputs(path: &Path, dims: &Dims) -> Result<Outputs, KdaError> {
    let bytes = std::fs::read(path).map_err(|source| io_error(path, source))?;
    let origin = path.display().to_string();
    let file =
        SafeTensors::deserialize(&bytes).map_err(|e| KdaError::Safetensors { path: origin, reason: e.to_string() })?;
    dims.check()?;
    Ok(Outputs {
        h: bf16_values(Tensor::H, &require(&file, Tensor::H)?, &dims.shape_of(Tensor::H))?,
        v_new: bf16_values(Tensor::VNew, &require(&file, Tensor::VNew)?, &dims.shape_of(Tensor::VNew))?,
        ht: f32_values(Tensor::Ht, &require(&file, Tensor::Ht)?, &dims.shape_of(Tensor::Ht))?,
    })
}

/// Writes `h`, `v_new` and `ht` of a problem of sizes `dims` to `path`.
pub fn write_outputs(path: &Path, out: &Outputs, dims: &Dims) -> Result<(), KdaError> {
    let mut file = TensorFile::default();
    file.outputs(out, dims)?;
    file.write(path)
}

/// The shapes of the outputs `h`, `v_new` and `ht` of the generalized problem `p`.
fn model_output_shapes(p: &ModelView<'_>) -> [Vec<usize>; 3] {
    let s = p.shape;
    let state = |lead: usize| match s.layout {
        StateLayout::KeyFirst => vec![lead, s.value_heads, s.key_dim, s.value_dim],
        StateLayout::ValueFirst => vec![lead, s.value_heads, s.value_dim, s.key_dim],
    };
    [state(p.plan.chunks()), vec![p.plan.tokens(), s.value_heads, s.value_dim], state(p.plan.num_seqs())]
}

/// Reads the outputs `h`, `v_new` and `ht` of the generalized problem `p` from `path` (a file
/// [`write_model_outputs`] or `kda run --cpu` wrote).
pub fn read_model_outputs(path: &Path, p: &ModelView<'_>) -> Result<Outputs, KdaError> {
    let bytes = std::fs::read(path).map_err(|source| io_error(path, source))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| KdaError::Safetensors { path: path.display().to_string(), reason: e.to_string() })?;
    let [h, v, t] = model_output_shapes(p);
    let get = |name: &'static str| file.tensor(name).map_err(|_| KdaError::MissingTensor { tensor: name });
    Ok(Outputs {
        h: bf16_of(checked_named("h", Stored::Bf16, &get("h")?, &h)?),
        v_new: bf16_of(checked_named("v_new", Stored::Bf16, &get("v_new")?, &v)?),
        ht: f32_of(checked_named("ht", Stored::F32, &get("ht")?, &t)?),
    })
}

/// Writes the outputs `h`, `v_new` and `ht` of the generalized problem `p` to `path`, in its
/// state layout.
pub fn write_model_outputs(path: &Path, out: &Outputs, p: &ModelView<'_>) -> Result<(), KdaError> {
    p.validate()?;
    let shapes = model_output_shapes(p);
    let lens = [out.h.len(), out.v_new.len(), out.ht.len()];
    for ((name, shape), len) in ["h", "v_new", "ht"].into_iter().zip(&shapes).zip(lens) {
        let expected_len: usize = shape.iter().product();
        if len != expected_len {
            return Err(KdaError::Shape {
                tensor: name,
                expected: format!("{shape:?}"),
                expected_len,
                actual: format!("{len} elements"),
            });
        }
    }
    let [h, v, t] = shapes;
    let mut file = TensorFile::default();
    file.push("h", Dtype::BF16, h, bf16_bytes(&out.h));
    file.push("v_new", Dtype::BF16, v, bf16_bytes(&out.v_new));
    file.push("ht", Dtype::F32, t, f32_bytes(&out.ht));
    file.write(path)
}

/// Writes a layer's outputs, `o` `[T, HV, V]` and `ht` `[N, HV, K, V]` (f32), to `path`, whole
/// or not at all.
pub fn write_layer_outputs(
    path: &Path,
    out: &crate::layer::LayerOutputs,
    p: &crate::layer::LayerProblem,
) -> Result<(), KdaError> {
    let s = p.shape;
    let shapes = [
        ("o", vec![p.plan.tokens(), s.value_heads, s.value_dim], &out.o),
        ("ht", vec![p.plan.num_seqs(), s.value_heads, s.key_dim, s.value_dim], &out.ht),
    ];
    let mut file = TensorFile::default();
    for (name, shape, values) in shapes {
        let expected_len: usize = shape.iter().product();
        if values.len() != expected_len {
            return Err(KdaError::Shape {
                tensor: name,
                expected: format!("{shape:?}"),
                expected_len,
                actual: format!("{} elements", values.len()),
            });
        }
        file.push(name, Dtype::F32, shape, f32_bytes(values));
    }
    file.write(path)
}

/// Writes a problem's inputs (with `cu_seqlens` as i64), and its outputs when given, to `path`.
pub fn write_problem(path: &Path, p: &Problem, out: Option<&Outputs>) -> Result<(), KdaError> {
    p.validate()?;
    let d = p.dims();
    let mut file = TensorFile::default();
    file.inputs(p);
    let cu = p.plan.cu_seqlens();
    file.push("cu_seqlens", Dtype::I64, vec![cu.len()], cu.iter().flat_map(|c| c.to_le_bytes()).collect());
    if let Some(out) = out {
        file.outputs(out, &d)?;
    }
    file.write(path)
}

/// Writes a generalized problem's inputs (`k`, `w`, `u`, the gates its shape names, `h0` when
/// given, `cu_seqlens` as i64) and its outputs when given to `path`, with the metadata entry
/// `state_layout`, as [`read_model_problem`] reads them.
pub fn write_model_problem(path: &Path, p: &ModelView<'_>, out: Option<&Outputs>) -> Result<(), KdaError> {
    p.validate()?;
    let s = p.shape;
    let (t, n, h, hv, kd, vd) = (p.plan.tokens(), p.plan.num_seqs(), s.heads, s.value_heads, s.key_dim, s.value_dim);
    let mut file = TensorFile::default();
    file.push("k", Dtype::BF16, vec![t, h, kd], bf16_bytes(p.k));
    file.push("w", Dtype::BF16, vec![t, hv, kd], bf16_bytes(p.w));
    file.push("u", Dtype::BF16, vec![t, hv, vd], bf16_bytes(p.u));
    if let Some(g) = p.g {
        file.push("g", Dtype::F32, vec![t, hv], f32_bytes(g));
    }
    if let Some(gk) = p.gk {
        file.push("gk", Dtype::F32, vec![t, hv, kd], f32_bytes(gk));
    }
    if let Some(h0) = p.h0 {
        let state = model_output_shapes(p)[2].clone();
        debug_assert_eq!(state[0], n);
        file.push("h0", Dtype::F32, state, f32_bytes(h0));
    }
    let cu = p.plan.cu_seqlens();
    file.push("cu_seqlens", Dtype::I64, vec![cu.len()], cu.iter().flat_map(|c| c.to_le_bytes()).collect());
    if let Some(out) = out {
        let [hs, vs, ts] = model_output_shapes(p);
        file.push("h", Dtype::BF16, hs, bf16_bytes(&out.h));
        file.push("v_new", Dtype::BF16, vs, bf16_bytes(&out.v_new));
        file.push("ht", Dtype::F32, ts, f32_bytes(&out.ht));
    }
    let layout = match s.layout {
        StateLayout::KeyFirst => "[K, V]",
        StateLayout::ValueFirst => "[V, K]",
    };
    file.metadata.push(("state_layout".into(), layout.into()));
    file.write(path)
}

/// Tensors gathered for one file: name, dtype, shape and little-endian bytes; metadata entries
/// beside the producer's.
#[derive(Default)]
struct TensorFile {
    tensors: Vec<(&'static str, Dtype, Vec<usize>, Vec<u8>)>,
    metadata: Vec<(String, String)>,
}

impl TensorFile {
    fn push(&mut self, name: &'static str, dtype: Dtype, shape: Vec<usize>, bytes: Vec<u8>) {
        self.tensors.push((name, dtype, shape, bytes));
    }

    /// Contract tensor `t` of a problem of sizes `d`, in its stored type.
    fn tensor(&mut self, d: &Dims, t: Tensor, bytes: Vec<u8>) {
        self.push(t.name(), Stored::of(t).dtype(), d.shape_of(t), bytes);
    }

    /// `k`, `w`, `u`, `gk` and, when present, `h0` of `p`, in that order.
    fn inputs(&mut self, p: &Problem) {
        let d = p.dims();
        self.tensor(&d, Tensor::K, bf16_bytes(&p.k));
        self.tensor(&d, Tensor::W, bf16_bytes(&p.w));
        self.tensor(&d, Tensor::U, bf16_bytes(&p.u));
        self.tensor(&d, Tensor::Gk, f32_bytes(&p.gk));
        if let Some(h0) = &p.h0 {
            self.tensor(&d, Tensor::H0, f32_bytes(h0));
        }
    }

    fn outputs(&mut self, out: &Outputs, d: &Dims) -> Result<(), KdaError> {
        d.check_len(Tensor::H, out.h.len())?;
        d.check_len(Tensor::VNew, out.v_new.len())?;
        d.check_len(Tensor::Ht, out.ht.len())?;
        self.tensor(d, Tensor::H, bf16_bytes(&out.h));
        self.tensor(d, Tensor::VNew, bf16_bytes(&out.v_new));
        self.tensor(d, Tensor::Ht, f32_bytes(&out.ht));
        Ok(())
    }

    /// Writes the file atomically: into a temporary file beside `path`, renamed over `path` only
    /// once complete, so `path` holds either its old content or the whole new file, never a part
    /// (the temporary file is removed on error).
    fn write(&self, path: &Path) -> Result<(), KdaError> {
        let origin = || path.display().to_string();
        let views = self
            .tensors
            .iter()
            .map(|(name, dtype, shape, bytes)| TensorView::new(*dtype, shape.clone(), bytes).map(|v| (*name, v)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| KdaError::Safetensors { path: origin(), reason: e.to_string() })?;
        let mut metadata = HashMap::from([("producer".to_string(), "kda".to_string())]);
        metadata.extend(self.metadata.iter().cloned());
        let temp = temporary_beside(path);
        let written = safetensors::serialize_to_file(views, Some(metadata), &temp)
            .map_err(|e| match e {
                safetensors::SafeTensorError::IoError(source) => io_error(path, source),
                other => KdaError::Safetensors { path: origin(), reason: other.to_string() },
            })
            .and_then(|()| std::fs::rename(&temp, path).map_err(|source| io_error(path, source)));
        if written.is_err() {
            // Best effort: the temporary file may not exist (the directory may be missing).
            let _ = std::fs::remove_file(&temp);
        }
        written
    }
}

/// The file metadata's entry `key`, if any.
fn metadata_entry(bytes: &[u8], origin: &str, key: &str) -> Result<Option<String>, KdaError> {
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| KdaError::Safetensors { path: origin.into(), reason: e.to_string() })?;
    Ok(header.metadata().as_ref().and_then(|m| m.get(key)).cloned())
}

/// The temporary file the writers of this module use for `path`: they write into it and rename it
/// over `path` once it is complete. It lies in `path`'s directory (a rename within one directory is
/// atomic) and is named `.NAME.kda-PID.tmp` after `path`'s file name and this process.
///
/// A program that may be killed during a write can remove it then (the writers remove it on
/// error, but a signal runs no destructor).
pub fn temporary_beside(path: &Path) -> std::path::PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.kda-{}.tmp", std::process::id()))
}

fn io_error(path: &Path, source: std::io::Error) -> KdaError {
    KdaError::Io { path: path.display().to_string(), source }
}

fn require<'a>(file: &SafeTensors<'a>, tensor: Tensor) -> Result<TensorView<'a>, KdaError> {
    optional(file, tensor.name()).ok_or(KdaError::MissingTensor { tensor: tensor.name() })
}

fn optional<'a>(file: &SafeTensors<'a>, tensor: &str) -> Option<TensorView<'a>> {
    file.tensor(tensor).ok()
}

/// `(B, T, H)` of a token tensor `[T, H, d]` or `[B, T, H, d]` (B = 1 for the first form).
fn token_dims(tensor: Tensor, shape: &[usize], d: usize) -> Result<(usize, usize, usize), KdaError> {
    match *shape {
        [t, h, last] if last == d => Ok((1, t, h)),
        [b, t, h, last] if last == d => Ok((b, t, h)),
        _ => Err(KdaError::Shape {
            tensor: tensor.name(),
            expected: format!("[T, H, {d}] or [B, T, H, {d}]"),
            expected_len: 0,
            actual: format!("shape {shape:?}"),
        }),
    }
}

/// The plan of a `cu_seqlens` tensor, checked against the token count of `k`.
fn plan_from_cu_seqlens(cu: &TensorView, batch: usize, tokens: usize) -> Result<Plan, KdaError> {
    if batch != 1 {
        return Err(KdaError::Argument {
            name: "cu_seqlens",
            reason: format!("a ragged batch needs k of shape [1, T, H, K] or [T, H, K], not batch {batch}"),
        });
    }
    if cu.shape().len() != 1 {
        return Err(KdaError::Shape {
            tensor: "cu_seqlens",
            expected: "[N + 1]".into(),
            expected_len: 0,
            actual: format!("shape {:?}", cu.shape()),
        });
    }
    // The safetensors header fixes the data length to the shape, so there is no remainder.
    let values: Vec<i64> = match cu.dtype() {
        Dtype::I32 => cu.data().as_chunks::<4>().0.iter().map(|&b| i32::from_le_bytes(b).into()).collect(),
        Dtype::I64 => cu.data().as_chunks::<8>().0.iter().map(|&b| i64::from_le_bytes(b)).collect(),
        other => {
            return Err(KdaError::Dtype {
                tensor: "cu_seqlens".into(),
                expected: "I32 or I64",
                actual: format!("{other:?}"),
            });
        }
    };
    let plan = Plan::from_cu_seqlens(&values)?;
    if plan.tokens() != tokens {
        return Err(KdaError::CuSeqlens {
            index: values.len().saturating_sub(1),
            reason: format!("the last boundary is {}, but k holds T = {tokens} tokens", plan.tokens()),
        });
    }
    Ok(plan)
}

/// The element types the contract stores.
#[derive(Clone, Copy)]
enum Stored {
    Bf16,
    F32,
}

impl Stored {
    fn of(t: Tensor) -> Self {
        if t.element_bytes() == 2 { Stored::Bf16 } else { Stored::F32 }
    }

    fn dtype(self) -> Dtype {
        match self {
            Stored::Bf16 => Dtype::BF16,
            Stored::F32 => Dtype::F32,
        }
    }

    /// The name safetensors gives the type.
    fn name(self) -> &'static str {
        match self {
            Stored::Bf16 => "BF16",
            Stored::F32 => "F32",
        }
    }
}

/// Checks a tensor's dtype and exact shape; returns its bytes.
fn checked<'a>(tensor: Tensor, view: &TensorView<'a>, shape: &[usize]) -> Result<&'a [u8], KdaError> {
    checked_named(tensor.name(), Stored::of(tensor), view, shape)
}

/// [`checked`] for a tensor by name, stored as `stored`.
fn checked_named<'a>(
    name: &'static str,
    stored: Stored,
    view: &TensorView<'a>,
    shape: &[usize],
) -> Result<&'a [u8], KdaError> {
    if view.dtype() != stored.dtype() {
        return Err(KdaError::Dtype {
            tensor: name.into(),
            expected: stored.name(),
            actual: format!("{:?}", view.dtype()),
        });
    }
    if view.shape() != shape {
        return Err(KdaError::Shape {
            tensor: name,
            expected: format!("{shape:?}"),
            // Saturating, like `Dims::key_len` (the shapes come from checked `Dims`).
            expected_len: shape.iter().fold(1, |n, &d| n.saturating_mul(d)),
            actual: format!("shape {:?}", view.shape()),
        });
    }
    Ok(view.data())
}

fn bf16_values(tensor: Tensor, view: &TensorView, shape: &[usize]) -> Result<Vec<bf16>, KdaError> {
    Ok(bf16_of(checked(tensor, view, shape)?))
}

fn f32_values(tensor: Tensor, view: &TensorView, shape: &[usize]) -> Result<Vec<f32>, KdaError> {
    Ok(f32_of(checked(tensor, view, shape)?))
}

fn bf16_of(bytes: &[u8]) -> Vec<bf16> {
    bytes.as_chunks::<2>().0.iter().map(|&b| bf16::from_bits(u16::from_le_bytes(b))).collect()
}

fn f32_of(bytes: &[u8]) -> Vec<f32> {
    bytes.as_chunks::<4>().0.iter().map(|&b| f32::from_le_bytes(b)).collect()
}

fn bf16_bytes(values: &[bf16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect()
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{inputs, reference};

    /// A serialized file of `p` with `edit` applied to its tensor list.
    fn bytes_with(p: &Problem, edit: impl FnOnce(&mut TensorFile)) -> Vec<u8> {
        let mut f = TensorFile::default();
        f.inputs(p);
        let cu: Vec<u8> = p.plan.cu_seqlens().iter().flat_map(|&c| (c as i32).to_le_bytes()).collect();
        f.push("cu_seqlens", Dtype::I32, vec![p.plan.num_seqs() + 1], cu);
        edit(&mut f);
        let views: Vec<_> =
            f.tensors.iter().map(|(n, dt, s, b)| (*n, TensorView::new(*dt, s.clone(), b).unwrap())).collect();
        safetensors::serialize(views, None).unwrap()
    }

    /// Every gate kind and both layouts, with grouped heads and `K != V`: written and read back,
    /// inputs, shape and outputs unchanged.
    #[test]
    fn model_problems_round_trip_through_a_file() {
        use crate::model::{Gates, ModelShape};
        let dir = std::env::temp_dir().join(format!("kda-io-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (g, gk, layout) in [
            (true, false, StateLayout::KeyFirst),
            (false, true, StateLayout::ValueFirst),
            (true, true, StateLayout::ValueFirst),
            (false, false, StateLayout::KeyFirst),
        ] {
            let shape =
                ModelShape { heads: 1, value_heads: 2, key_dim: 64, value_dim: 128, gates: Gates { g, gk }, layout };
            let p = inputs::try_random_model_problem(Plan::from_lengths(&[70, 0, 3]), shape, true, 5).unwrap();
            let out = reference::model_reference(&p.view()).unwrap();
            let path = dir.join("model.safetensors");
            write_model_problem(&path, &p.view(), Some(&out)).unwrap();
            let (back, golden) = read_model_problem(&path).unwrap();
            assert_eq!((back.shape, back.plan.lengths()), (shape, vec![70, 0, 3]));
            assert_eq!(
                (&back.k, &back.w, &back.u, &back.g, &back.gk, &back.h0),
                (&p.k, &p.w, &p.u, &p.g, &p.gk, &p.h0)
            );
            assert_eq!(golden, Some(out));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn small() -> Problem {
        inputs::random_problem(Plan::from_lengths(&[5, 0, 66]), 2, false, 21)
    }

    fn remove(f: &mut TensorFile, name: &str) {
        f.tensors.retain(|t| t.0 != name);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let dir = std::env::temp_dir().join(format!("kda-io-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("out.safetensors");
        std::fs::write(&path, b"old").unwrap();
        let p = small();
        let out = reference::reference(&p).unwrap();
        // Outputs of the wrong size: nothing is written, the old file stays.
        let wrong = Dims::new(&Plan::from_lengths(&[1]), 1);
        assert!(write_outputs(&path, &out, &wrong).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        // A good write replaces it whole; no temporary file is left beside it.
        write_outputs(&path, &out, &p.dims()).unwrap();
        assert_eq!(read_outputs(&path, &p.dims()).unwrap(), out);
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["out.safetensors"], "{names:?}");
        // A missing directory: an error naming the path, and nothing created.
        let err = write_outputs(&dir.join("missing/out.safetensors"), &out, &p.dims()).unwrap_err();
        assert!(matches!(err, KdaError::Io { .. }), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn round_trip_keeps_every_value() {
        let dir = std::env::temp_dir().join(format!("kda-io-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rt.safetensors");
        let p = inputs::random_problem(Plan::from_lengths(&[1, 64, 0, 130]), 3, true, 2);
        let out = reference::reference(&p).unwrap();
        write_problem(&path, &p, Some(&out)).unwrap();
        let (back, expected) = read_problem(&path).unwrap();
        assert_eq!((back.plan, back.heads), (p.plan.clone(), p.heads));
        assert_eq!((back.k, back.w, back.u), (p.k, p.w, p.u));
        assert_eq!((back.gk, back.h0), (p.gk, p.h0));
        assert_eq!(expected.unwrap(), out);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn i32_cu_seqlens_and_no_outputs_parse() {
        let p = small();
        let (back, expected) = parse_problem(&bytes_with(&p, |_| {}), "mem").unwrap();
        assert_eq!(back.plan, p.plan);
        assert!(back.h0.is_none() && expected.is_none());
    }

    #[test]
    fn dense_batch_dimension_becomes_equal_sequences() {
        let p = inputs::random_problem(Plan::dense(3, 70), 1, false, 4);
        let bytes = bytes_with(&p, |f| {
            remove(f, "cu_seqlens");
            for t in &mut f.tensors {
                t.2 = [&[3, 70], &t.2[1..]].concat();
            }
        });
        let (back, _) = parse_problem(&bytes, "mem").unwrap();
        assert_eq!(back.plan, Plan::dense(3, 70));
        assert_eq!(back.k, p.k);
    }

    #[test]
    fn missing_tensor_is_named() {
        for name in ["k", "w", "u", "gk"] {
            let err = parse_problem(&bytes_with(&small(), |f| remove(f, name)), "mem").unwrap_err();
            assert!(matches!(err, KdaError::MissingTensor { tensor } if tensor == name), "{name}: {err}");
        }
    }

    #[test]
    fn wrong_dtype_is_named() {
        let p = small();
        let bytes = bytes_with(&p, |f| {
            remove(f, "gk");
            f.push("gk", Dtype::BF16, p.dims().shape_of(Tensor::Gk), bf16_bytes(&p.k));
        });
        let err = parse_problem(&bytes, "mem").unwrap_err();
        assert!(matches!(&err, KdaError::Dtype { tensor, .. } if tensor == "gk"), "{err}");
        assert!(err.to_string().contains("expected dtype F32, got BF16"), "{err}");
    }

    #[test]
    fn wrong_head_dim_and_mismatched_shapes_are_named() {
        let p = small();
        let t = p.plan.tokens();
        let bytes = bytes_with(&p, |f| f.tensors[0].2 = vec![t, 4, 64]);
        let err = parse_problem(&bytes, "mem").unwrap_err();
        assert!(matches!(err, KdaError::Shape { tensor: "k", .. }), "{err}");

        let bytes = bytes_with(&p, |f| f.tensors[1].2 = vec![t, 1, 256]);
        let err = parse_problem(&bytes, "mem").unwrap_err();
        assert!(matches!(err, KdaError::Shape { tensor: "w", .. }), "{err}");

        let bytes = bytes_with(&p, |f| f.push("h0", Dtype::F32, vec![1, 2, 128, 128], vec![0; 4 * 2 * 128 * 128]));
        let err = parse_problem(&bytes, "mem").unwrap_err();
        assert!(matches!(err, KdaError::Shape { tensor: "h0", .. }), "{err}");
    }

    #[test]
    fn grouped_value_heads_round_trip_and_must_divide() {
        let p = inputs::try_random_grouped_problem(Plan::from_lengths(&[5, 0, 70]), 2, 6, true, 3).unwrap();
        let bytes = bytes_with(&p, |_| {});
        let (back, _) = parse_problem(&bytes, "mem").unwrap();
        assert_eq!((back.heads, back.value_heads), (2, 6));
        assert_eq!((back.k, back.w, back.h0), (p.k.clone(), p.w.clone(), p.h0.clone()));
        // 6 value heads over 4 key heads: not a grouping.
        let t = p.plan.tokens();
        let bytes = bytes_with(&p, |f| {
            f.tensors[0].2 = vec![t, 4, 128];
            f.tensors[0].3 = vec![0; t * 4 * 128 * 2];
        });
        let err = parse_problem(&bytes, "mem").unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "value_heads", .. }), "{err}");
    }

    #[test]
    fn bad_cu_seqlens_are_reported() {
        let p = small();
        let with_cu = |cu: Vec<i64>| {
            bytes_with(&p, move |f| {
                remove(f, "cu_seqlens");
                f.push("cu_seqlens", Dtype::I64, vec![cu.len()], cu.iter().flat_map(|c| c.to_le_bytes()).collect());
            })
        };
        let short = parse_problem(&with_cu(vec![0, 5, 70]), "mem").unwrap_err();
        assert!(matches!(short, KdaError::CuSeqlens { index: 2, .. }), "{short}");
        let decreasing = parse_problem(&with_cu(vec![0, 6, 5, 71]), "mem").unwrap_err();
        assert!(matches!(decreasing, KdaError::CuSeqlens { .. }), "{decreasing}");
        let float = bytes_with(&p, |f| {
            remove(f, "cu_seqlens");
            f.push("cu_seqlens", Dtype::F32, vec![2], f32_bytes(&[0.0, 71.0]));
        });
        let err = parse_problem(&float, "mem").unwrap_err();
        assert!(matches!(&err, KdaError::Dtype { tensor, .. } if tensor == "cu_seqlens"), "{err}");
    }

    #[test]
    fn degenerate_dense_files_are_errors_not_panics() {
        let empty = |shape: Vec<usize>| {
            let mut f = TensorFile::default();
            for (name, dtype) in [("k", Dtype::BF16), ("w", Dtype::BF16), ("u", Dtype::BF16), ("gk", Dtype::F32)] {
                f.push(name, dtype, shape.clone(), vec![]);
            }
            let views: Vec<_> =
                f.tensors.iter().map(|(n, dt, s, b)| (*n, TensorView::new(*dt, s.clone(), b).unwrap())).collect();
            safetensors::serialize(views, None).unwrap()
        };
        // No heads.
        let err = parse_problem(&empty(vec![5, 0, 128]), "mem").unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "heads", .. }), "{err}");
        // A dense batch of empty sequences too many for any table, or for the outputs' memory.
        let err = parse_problem(&empty(vec![usize::MAX, 0, 1, 128]), "mem").unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "lengths", .. }), "{err}");
        let err = parse_problem(&empty(vec![1 << 50, 0, 1, 128]), "mem").unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "lengths", .. } | KdaError::TooLarge { .. }), "{err}");
        let err = parse_problem(&empty(vec![2, 0, 1 << 50, 128]), "mem").unwrap_err();
        assert!(matches!(err, KdaError::TooLarge { tensor: "h0", .. }), "{err}");
        // A few empty sequences are a valid problem.
        let (p, _) = parse_problem(&empty(vec![3, 0, 2, 128]), "mem").unwrap();
        assert_eq!((p.plan, p.heads), (Plan::dense(3, 0), 2));
    }

    #[test]
    fn garbage_and_missing_files_are_reported() {
        let err = parse_problem(b"not a safetensors file", "junk.bin").unwrap_err();
        assert!(matches!(&err, KdaError::Safetensors { path, .. } if path == "junk.bin"), "{err}");
        let err = read_problem(Path::new("/nonexistent/kda.safetensors")).unwrap_err();
        assert!(matches!(err, KdaError::Io { .. }), "{err}");
    }
}
