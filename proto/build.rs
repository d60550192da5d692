//! Compiles the `.proto` contract with protox, so no system `protoc` is needed.
//!
//! Each file is generated into its own folder, because the Registry service
//! takes a codec of its own (`crate::codec::HeartbeatCodec`, see there) and
//! the codec is chosen per generation.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let files = [
        ("registry", "crate::codec::HeartbeatCodec"),
        ("plugin", "tonic_prost::ProstCodec"),
    ];
    for (stem, codec) in files {
        let file = format!("kplug/v1alpha1/{stem}.proto");
        println!("cargo:rerun-if-changed={file}");
        let dir = out.join(stem);
        std::fs::create_dir_all(&dir)?;
        let descriptors = protox::compile([&file], ["."])?;
        tonic_prost_build::configure()
            .out_dir(&dir)
            .codec_path(codec)
            // A reconcile's object and extensions as `bytes::Bytes`: kplug hands
            // the plugin slices of the HTTP request body instead of copies.
            .bytes(".kplug.v1alpha1.ReconcileRequest")
            .compile_fds(descriptors)?;
    }
    Ok(())
}
