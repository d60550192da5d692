//! Compiles the `.proto` contract with protox, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "kplug/v1alpha1/registry.proto",
        "kplug/v1alpha1/plugin.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["."])?;
    tonic_prost_build::configure()
        // A reconcile's object and extensions as `bytes::Bytes`: kplug hands
        // the plugin slices of the HTTP request body instead of copies.
        .bytes(".kplug.v1alpha1.ReconcileRequest")
        .compile_fds(descriptors)?;
    Ok(())
}
