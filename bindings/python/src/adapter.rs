//! `trash_panda._core` adapter files mapped onto a model's layers (the core's `adapter`).

use std::collections::HashMap;

use pyo3::prelude::*;

use trash_panda::adapter::{self, LayerShape, MapOptions};

use crate::errors::ToPyErr;

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

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLayerAdapter>()?;
    m.add_class::<PyAdapterMap>()?;
    m.add_function(wrap_pyfunction!(map_adapter, m)?)?;
    Ok(())
}
