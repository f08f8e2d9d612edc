//! Generates the `Items` service and client from `proto/items.proto` with protox, a pure-Rust
//! protobuf compiler, so building needs no `protoc` binary.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/items.proto");
    let descriptors = protox::compile(["proto/items.proto"], ["proto"])?;
    tonic_prost_build::configure().build_transport(true).compile_fds(descriptors)?;
    Ok(())
}
