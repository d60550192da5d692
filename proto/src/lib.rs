//! kplug's gRPC contract, generated from `proto/kplug/v1alpha1/*.proto`,
//! the trace context that travels with its calls, and the duration form
//! both sides' command lines take.

pub mod duration;
pub mod trace;

/// Version `v1alpha1` of the contract.
pub mod v1alpha1 {
    tonic::include_proto!("kplug.v1alpha1");

    /// The protocol version this crate implements.
    pub const PROTOCOL_VERSION: &str = "v1alpha1";
}
