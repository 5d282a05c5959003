//! Compiles `proto/**/*.proto` with protox (pure Rust; no system `protoc`).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/stele/v1/data.proto",
        "proto/stele/v1/controller.proto",
        "proto/stele/v1/directory.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true);
    compiler.open_files(files)?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("stele_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    tonic_prost_build::configure().compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
