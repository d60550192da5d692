//! Compiles gnostic's `openapi.v2` messages (the protobuf form of the
//! Swagger 2.0 document, vendored in `proto/openapiv2/`) with protox, so no
//! system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = "openapiv2/OpenAPIv2.proto";
    println!("cargo:rerun-if-changed=proto/{file}");
    let descriptors = protox::compile([file], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
