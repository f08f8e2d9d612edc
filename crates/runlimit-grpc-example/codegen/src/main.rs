//! Writes `src/generated/runlimit.example.v1.rs` of runlimit-grpc-example from
//! `proto/items.proto`: tonic-prost-build's output (messages, the `Items` and `Probe` servers
//! and clients), under a header that records the proto's SHA-256, which the example's tests
//! compare with the proto file.

use std::{fs, path::Path};

use sha2::{Digest as _, Sha256};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let proto = example.join("proto");
    let out = std::env::temp_dir().join(format!("runlimit-grpc-example-codegen-{}", std::process::id()));
    fs::create_dir_all(&out)?;
    let descriptors = protox::compile([proto.join("items.proto")], [&proto])?;
    tonic_prost_build::configure().build_transport(true).out_dir(&out).compile_fds(descriptors)?;
    let generated = fs::read_to_string(out.join("runlimit.example.v1.rs"))?;
    fs::remove_dir_all(&out)?;
    let digest = Sha256::digest(fs::read(proto.join("items.proto"))?);
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    let header = format!(
        "// Generated from proto/items.proto (SHA-256 {hex}) by codegen/ (tonic-prost-build);\n\
         // do not edit: `cargo run --manifest-path crates/runlimit-grpc-example/codegen/Cargo.toml`.\n"
    );
    let target = example.join("src/generated/runlimit.example.v1.rs");
    fs::write(&target, header + &generated)?;
    println!("wrote {}", target.display());
    Ok(())
}
