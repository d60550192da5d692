//! The types of kplug's API group `plugins.kplug.io`: what the server
//! serves and what clients (the operator library, kubectl plugins) send and
//! read. Like `k8s.io/api`, this crate holds types and pure rules over them
//! (which plugin serves a request, [`selection`]; what a plugin may answer,
//! [`answer`], and the children it may ask for, [`children`]), no
//! behaviour that needs IO.

pub mod access;
pub mod answer;
pub mod canary;
pub mod children;
pub mod reference;
pub mod selection;
pub mod shadow;
pub mod v1alpha1;
pub mod validation;
pub mod version;
