//! What a read from a checkpoint file may trust: the file still holds the run and is the file
//! the engine opened, unchanged since. Another program that writes over a checkpoint while a
//! model uses it would otherwise give the model a mix of two files' bytes (or, past a truncated
//! end of a map, SIGBUS); the checks turn that into an error naming the tensor and the file.

use std::fs::File;

use super::super::convert::failed_at;
use super::super::StreamError;
use super::CheckpointSource;
use crate::io::{FileStamp, IoError};
use crate::rules::layout::Run;

impl CheckpointSource {
    /// The error for a failed read of `run` of `block`, naming the tensor that holds byte `at`.
    pub(super) fn read_error(&self, block: usize, run: &Run, source: IoError) -> StreamError {
        let at = match failed_at(&source) {
            0 => run.start,
            at => at,
        };
        let tensors = &self.blocks[block].tensors;
        let t = run
            .tensors
            .iter()
            .map(|&i| &tensors[i])
            .find(|t| t.start <= at && at < t.end)
            .or_else(|| {
                run.tensors
                    .iter()
                    .map(|&i| &tensors[i])
                    .find(|t| t.end > at)
            })
            .unwrap_or(&tensors[*run.tensors.last().expect("a run has a tensor")]);
        StreamError::read(block, &self.blocks[block], t, &self.files, source)
    }

    /// An error naming the tensor if `file` no longer holds `run` (truncated since it was opened)
    /// or is no longer the file the engine opened, unchanged: written to, replaced or resized
    /// since, when the header's offsets may find other bytes.
    pub(super) fn check_file(
        &self,
        block: usize,
        run: &Run,
        file: &File,
    ) -> Result<(), StreamError> {
        let path = &self.files[run.file];
        let now = file.metadata().map_err(|source| {
            let e = IoError::Read {
                path: path.clone(),
                offset: run.start,
                len: run.len() as u64,
                source,
            };
            self.read_error(block, run, e)
        })?;
        if now.len() < run.end {
            let e = IoError::UnexpectedEof {
                path: path.clone(),
                offset: run.start,
                len: run.len() as u64,
                got_to: now.len().max(run.start),
            };
            return Err(self.read_error(block, run, e));
        }
        if let Some(change) = self.stamps[run.file].differs(&FileStamp::of(&now)) {
            let e = IoError::Changed {
                path: path.clone(),
                change,
            };
            return Err(self.read_error(block, run, e));
        }
        Ok(())
    }

    /// [`check_file`](Self::check_file) once for each file `block` reads, `file_of` giving the
    /// open file of a file index: one look at each file's metadata, however many runs it has.
    pub(super) fn check_files<'a>(
        &'a self,
        block: usize,
        file_of: impl Fn(usize) -> &'a File,
    ) -> Result<(), StreamError> {
        let runs = &self.layout.blocks[block].runs;
        for (i, run) in runs.iter().enumerate() {
            if runs[..i].iter().all(|r| r.file != run.file) {
                self.check_file(block, run, file_of(run.file))?;
            }
        }
        Ok(())
    }
}
