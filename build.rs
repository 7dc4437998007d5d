//! Compiles Optuna's storage protocol (`proto/optuna_storage.proto`) into tonic server code
//! with protox, a pure-Rust protobuf compiler: no `protoc` needed to build Augur.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/optuna_storage.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .compile_fds(descriptors)?;
    Ok(())
}
