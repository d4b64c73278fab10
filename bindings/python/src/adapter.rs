//! `trash_panda._core` adapter files mapped onto a model's layers (the core's `adapter`).

use std::collections::HashMap;

use pyo3::prelude::*;

use trash_panda::adapter::{self, AdapterKind, LayerShape, LayerWork, MapOptions};

use crate::errors::{raise, Kind, ToPyErr};

/// One layer's patch, checked: its layer, kind (`lora`, `lokr`, `loha`), rank, scale and the
/// file's tensors that make it, by part (`down`, `up`, `alpha`, `lokr_w1`, ...).
#[pyclass(name = "LayerAdapter", module = "trash_panda._core", frozen, get_all)]
#[derive(Debug, Clone)]
pub(crate) struct PyLayerAdapter {
    /// The layer's module name in the model.
    layer: String,
    /// `lora`, `lokr` or `loha`.
    kind: &'static str,
    /// Its rank (0 for a LoKr whose factors are both whole).
    rank: u64,
    /// What its update is multiplied by before the user's weight.
    scale: f64,
    /// The alpha `scale` divides by the rank (the rank itself where the file gives none; 0
    /// with no rank): what PEFT takes with the rank.
    alpha: f64,
    /// The file's tensor for each part.
    parts: HashMap<&'static str, String>,
}

#[pymethods]
impl PyLayerAdapter {
    fn __repr__(&self) -> String {
        format!(
            "LayerAdapter({:?}, kind={}, rank={}, scale={})",
            self.layer, self.kind, self.rank, self.scale
        )
    }
}

/// An adapter file mapped onto a model: the layers it patches, in the model's order, and the
/// tensors it holds for other components of a pipeline (left alone).
#[pyclass(name = "AdapterMap", module = "trash_panda._core", frozen, get_all)]
#[derive(Debug)]
pub(crate) struct PyAdapterMap {
    /// The layers it patches.
    layers: Vec<PyLayerAdapter>,
    /// Tensors for other components.
    skipped: Vec<String>,
}

/// Maps an adapter file's `tensors` (name, shape) onto a model's `layers` (module name, weight
/// shape) by the core's rules; `alphas` holds the value of each alpha tensor, by name.
/// `component`: the pipeline component the model is (other components' tensors are skipped);
/// `lora_alpha` and `use_rslora`: PEFT's adapter_config.json. A file that does not fit raises
/// CheckpointError naming the tensor (and, for a key that matches no layer, the nearest ones).
#[pyfunction]
#[pyo3(signature = (tensors, alphas, layers, *, component=None, lora_alpha=None, use_rslora=false))]
fn map_adapter(
    tensors: Vec<(String, Vec<u64>)>,
    alphas: HashMap<String, f64>,
    layers: Vec<(String, Vec<u64>)>,
    component: Option<String>,
    lora_alpha: Option<f64>,
    use_rslora: bool,
) -> PyResult<PyAdapterMap> {
    let layers: Vec<LayerShape> = layers
        .into_iter()
        .map(|(name, weight)| LayerShape { name, weight })
        .collect();
    let options = MapOptions {
        component,
        lora_alpha,
        use_rslora,
    };
    let map = adapter::map_adapter(&tensors, &alphas, &layers, &options).map_err(ToPyErr::to_py)?;
    Ok(PyAdapterMap {
        layers: map
            .layers
            .into_iter()
            .map(|l| PyLayerAdapter {
                layer: l.layer,
                kind: l.kind.name(),
                rank: l.rank,
                scale: l.scale,
                alpha: l.alpha,
                parts: l.parts.into_iter().map(|(p, k)| (p.key(), k)).collect(),
            })
            .collect(),
        skipped: map.skipped,
    })
}

/// The way a streamed layer runs its adapter (`merged_kept`, `merged_each_run` or `unmerged`),
/// why, and the per-run costs the core compared (multiply-adds).
#[pyclass(name = "WayChoice", module = "trash_panda._core", frozen, get_all)]
#[derive(Debug, Clone)]
pub(crate) struct PyWayChoice {
    /// `merged_kept`, `merged_each_run` or `unmerged`.
    way: &'static str,
    /// Why, in words for a report.
    why: String,
    /// What merging costs on a run (once, when kept).
    merge_cost: u64,
    /// What running the adapter unmerged costs on a run.
    unmerged_cost: u64,
}

#[pymethods]
impl PyWayChoice {
    fn __repr__(&self) -> String {
        format!("WayChoice({}, {:?})", self.way, self.why)
    }
}

/// Chooses how a streamed layer runs its adapter (the core's cost model): kept merged where
/// `can_keep` and more than one run is left (`runs_left` None: not known), else the cheaper per
/// run of merging on each run and running it unmerged, for `tokens` a call and `calls` a run.
#[pyfunction]
#[pyo3(signature = (kind, rank, in_features, out_features, tokens, *, calls=1, can_keep=false, runs_left=None))]
#[allow(clippy::too_many_arguments)]
fn choose_adapter_way(
    kind: &str,
    rank: u64,
    in_features: u64,
    out_features: u64,
    tokens: u64,
    calls: u64,
    can_keep: bool,
    runs_left: Option<u64>,
) -> PyResult<PyWayChoice> {
    let kind = match kind {
        "lora" => AdapterKind::Lora,
        "loha" => AdapterKind::Loha,
        "lokr" => AdapterKind::Lokr,
        other => {
            return Err(raise(
                Kind::Argument,
                format!("kind: expected one of lora, loha, lokr, got {other:?}"),
            ))
        }
    };
    let work = LayerWork {
        kind,
        rank,
        in_features,
        out_features,
        tokens,
        calls,
    };
    let c = adapter::choose_way(&work, can_keep, runs_left);
    Ok(PyWayChoice {
        way: c.way.name(),
        why: c.why,
        merge_cost: c.merge_cost,
        unmerged_cost: c.unmerged_cost,
    })
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLayerAdapter>()?;
    m.add_class::<PyAdapterMap>()?;
    m.add_class::<PyWayChoice>()?;
    m.add_function(wrap_pyfunction!(map_adapter, m)?)?;
    m.add_function(wrap_pyfunction!(choose_adapter_way, m)?)?;
    Ok(())
}
