//! With the `embedded-site` feature, embeds the built site (WASM, JS, CSS and the
//! public assets) in the binary, so a release `holdfast` serves the dashboard and
//! the widget from any directory with no files beside it.
//!
//! The site comes from `HOLDFAST_SITE_DIR` (default: the workspace's
//! `target/site`, where `scripts/lib.sh`'s `build_site` puts it). Without the
//! feature the table is empty and the site is served from `--site-root`.

use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hasher};
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=HOLDFAST_SITE_DIR");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut table = String::from("&[\n");
    if std::env::var_os("CARGO_FEATURE_EMBEDDED_SITE").is_some() {
        let dir = match std::env::var_os("HOLDFAST_SITE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/site"),
        };
        let dir = dir.canonicalize().unwrap_or_else(|e| {
            panic!(
                "the embedded-site feature needs the built site at {} ({e}); build it with \
                 `scripts/run.sh --release` or set HOLDFAST_SITE_DIR",
                dir.display()
            )
        });
        // A directory named here is rescanned by cargo for changes to any file in it.
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files = Vec::new();
        collect(&dir, &dir, &mut files);
        files.sort();
        assert!(
            files.iter().any(|(url, _)| url == "/pkg/holdfast.wasm"),
            "{} holds no pkg/holdfast.wasm: it is not a built site",
            dir.display()
        );
        for (url, path) in files {
            let bytes = std::fs::read(&path).expect("site file readable");
            let mut hasher = DefaultHasher::new();
            hasher.write(&bytes);
            // The ETag changes whenever the bytes do; the name never does.
            writeln!(
                table,
                "    ({url:?}, include_bytes!({path:?}), \"\\\"{:016x}\\\"\"),",
                hasher.finish()
            )
            .expect("write to a String");
        }
    }
    table.push(']');
    std::fs::write(out.join("site_files.rs"), table).expect("OUT_DIR writable");
}

/// Every regular file under `dir`, as (URL path, file path).
fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("site directory readable") {
        let path = entry.expect("site directory entry").path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if path.is_file() {
            let relative = path.strip_prefix(root).expect("under the root");
            let url = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            files.push((format!("/{url}"), path.display().to_string()));
        }
    }
}
