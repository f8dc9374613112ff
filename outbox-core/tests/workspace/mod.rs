//! Reading the workspace's own files, for the tests that check docs and surfaces
//! against the code (`doc_lists`, `public_names`, `readme_usage`).

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace root: the folder above `outbox-core`.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("outbox-core sits in the workspace root")
        .to_path_buf()
}

/// The text of `path`, or a panic naming it.
pub(crate) fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}
