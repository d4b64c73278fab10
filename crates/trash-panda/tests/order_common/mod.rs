//! What the order-file test binaries share: a model's block names and files written for them.

use std::fs;
use std::path::Path;

use trash_panda::order::{read_order_file, OrderRead, ORDER_FORMAT, ORDER_VERSION};

/// A Flux-like model: 3 double blocks then 2 single blocks, spelt as the planner does.
pub const MODEL: [&str; 5] = [
    "double_blocks.0.",
    "double_blocks.1.",
    "double_blocks.2.",
    "single_blocks.0.",
    "single_blocks.1.",
];

pub fn order_json(blocks: &[&str]) -> String {
    serde_json::json!({
        "format": ORDER_FORMAT,
        "version": ORDER_VERSION,
        "checkpoint": "model.safetensors",
        "blocks": blocks,
    })
    .to_string()
}

pub fn read_text(dir: &Path, text: &str) -> OrderRead {
    let path = dir.join("model_order.json");
    fs::write(&path, text).unwrap();
    read_order_file(&path, &MODEL).unwrap()
}
