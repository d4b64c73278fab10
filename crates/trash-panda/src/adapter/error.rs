//! The one error type of the `adapter` module.

/// What makes an adapter file unusable on a model. Every variant names the tensor and says what
/// was expected; the model is never touched before a mapping is whole.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdapterError {
    /// A tensor's name says it patches a layer, but no layer of the model has that name.
    ///
    /// What to do: the adapter was made for another model (or another component of the
    /// pipeline): load it into the model it was trained on. The nearest layer names are listed.
    #[error(
        "adapter tensor {key:?} patches layer {target:?}, which the model does not have{}",
        near_list(nearest)
    )]
    NoLayer {
        /// The tensor's name in the adapter file.
        key: String,
        /// The layer it names, as the model would name it.
        target: String,
        /// Up to three of the model's layer names nearest to it.
        nearest: Vec<String>,
    },

    /// A tensor's name says it patches one layer, which two of the model's layers could be (an
    /// underscore-joined kohya name read back both ways).
    ///
    /// What to do: the file's naming cannot tell these layers apart; convert it to PEFT's
    /// dotted names.
    #[error("adapter tensor {key:?} could be layer {first:?} or {second:?} of the model")]
    Ambiguous {
        /// The tensor's name in the adapter file.
        key: String,
        /// One layer it could be.
        first: String,
        /// Another.
        second: String,
    },

    /// Two tensors of the file are the same part of one layer's adapter (a PEFT name and a
    /// kohya name for it, say).
    ///
    /// What to do: the file mixes two adapters' keys: keep one of them.
    #[error("adapter tensors {key:?} and {other:?} are both the {part} of layer {layer:?}")]
    Duplicate {
        /// The tensor read second.
        key: String,
        /// The one read first.
        other: String,
        /// The part, in words.
        part: &'static str,
        /// The layer.
        layer: String,
    },

    /// A tensor is a part of an adapter kind not applied yet.
    ///
    /// What to do: the file needs a feature this version lacks (the message says which):
    /// convert the adapter to a plain LoRA, LoKr or LoHa, or merge it into the checkpoint.
    #[error("adapter tensor {key:?} is {what}, which is not supported yet")]
    Unsupported {
        /// The tensor's name in the adapter file.
        key: String,
        /// What it is, in words.
        what: &'static str,
    },

    /// A layer's adapter is missing a part it needs (a LoRA's up matrix without its down one).
    ///
    /// What to do: the file is incomplete (cut short, or written by a tool that dropped keys):
    /// get it again.
    #[error("adapter for layer {layer:?} has {has} but not {missing}")]
    Incomplete {
        /// The layer.
        layer: String,
        /// The parts present, in words.
        has: String,
        /// The part missing, in words.
        missing: &'static str,
    },

    /// A tensor's shape does not fit its part or the layer it patches.
    ///
    /// What to do: the adapter was made for a model of another size (or the file is damaged):
    /// load the one made for this model.
    #[error("adapter tensor {key:?} has shape {found:?}, expected {expected}")]
    Shape {
        /// The tensor's name in the adapter file.
        key: String,
        /// Its shape.
        found: Vec<u64>,
        /// What was expected, in words (with the layer's shape).
        expected: String,
    },

    /// A layer's alpha is not one finite number.
    ///
    /// What to do: the file is damaged: get it again.
    #[error("adapter tensor {key:?} (alpha) must hold one finite number, found {found}")]
    Alpha {
        /// The tensor's name in the adapter file.
        key: String,
        /// What it held, in words.
        found: String,
    },

    /// No tensor of the file is an adapter's, as any known format names them.
    ///
    /// What to do: pass a LoRA, LoKr or LoHa file in PEFT, diffusers or kohya naming; a full
    /// checkpoint is loaded as a model, not as an adapter.
    #[error(
        "no tensor of the file is a LoRA, LoKr or LoHa part (first names: {first:?}); expected \
         names ending in lora_A/lora_B, lora_down/lora_up, lokr_w1/lokr_w2 or hada_w1_a"
    )]
    NotAnAdapter {
        /// Up to three of the file's tensor names.
        first: Vec<String>,
    },
}

fn near_list(nearest: &[String]) -> String {
    if nearest.is_empty() {
        String::new()
    } else {
        format!("; nearest: {}", nearest.join(", "))
    }
}
