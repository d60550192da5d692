//! kube-apiserver's words: kube-rs errors as a person reads them (kube-rs's
//! own `Display` of an API error appends the whole `Status` in `Debug` form,
//! `ApiError: ... (Status { status: Some(Failure), code: 403, ... })`; here
//! it is kube-apiserver's message with its code and reason, as kubectl
//! prints `Error from server (Reason)`), and resources named as its
//! messages name them.

/// The group-qualified resource: `widgets.example.com`, or `configmaps` for
/// the core group.
pub fn qualified_resource(resource: &str, group: &str) -> String {
    match group {
        "" => resource.to_owned(),
        group => format!("{resource}.{group}"),
    }
}

/// A kube client error, worded.
pub fn kube_error(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => match (status.code, status.reason.as_str()) {
            (0, "") => format!("kube-apiserver answered: {}", status.message),
            (code, "") => format!("kube-apiserver answered: {} ({code})", status.message),
            (code, reason) => {
                format!(
                    "kube-apiserver answered: {} ({code} {reason})",
                    status.message
                )
            }
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_error_is_its_message_code_and_reason_without_debug() {
        let error = kube::Error::Api(Box::new(kube::core::Status {
            code: 403,
            reason: "Forbidden".into(),
            message: "tokenreviews.authentication.k8s.io is forbidden".into(),
            ..Default::default()
        }));
        assert!(error.to_string().contains("Status {"), "kube-rs's own text");
        assert_eq!(
            kube_error(&error),
            "kube-apiserver answered: tokenreviews.authentication.k8s.io is forbidden (403 Forbidden)"
        );
    }
}
