//! Byte sources: memory maps, positional reads, O_DIRECT reads, parallel range reads.
