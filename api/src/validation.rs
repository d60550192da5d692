//! Kubernetes' validation rules for names, labels and addresses, with the
//! same wording as apimachinery so users recognise the messages.

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;
const LABEL_VALUE_MAX: usize = 63;
const QUALIFIED_NAME_MAX: usize = 63;

fn is_lower_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_dns1123_label_body(s: &str) -> bool {
    !s.is_empty()
        && s.starts_with(is_lower_alnum)
        && s.ends_with(is_lower_alnum)
        && s.chars().all(|c| is_lower_alnum(c) || c == '-')
}

/// Problems with `value`, as apimachinery's `IsDNS1123Label` words them.
pub fn dns1123_label(value: &str) -> Option<String> {
    if value.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters"
        ));
    }
    (!is_dns1123_label_body(value)).then(|| {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
         and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')"
            .to_owned()
    })
}

/// Problems with `value`, as apimachinery's `IsDNS1123Subdomain` words them.
pub fn dns1123_subdomain(value: &str) -> Option<String> {
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        return Some(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    (value.is_empty() || !value.split('.').all(is_dns1123_label_body)).then(|| {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' \
         or '.', and must start and end with an alphanumeric character (e.g. 'example.com')"
            .to_owned()
    })
}

fn is_qualified_name_part(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars()
            .all(|c| alnum(c) || c == '-' || c == '_' || c == '.')
}

/// Problems with a label key (`[prefix/]name`), as `IsQualifiedName` words them.
pub fn label_key(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && let Some(problem) = dns1123_subdomain(prefix)
    {
        return Some(format!("prefix part {problem}"));
    }
    if name.len() > QUALIFIED_NAME_MAX {
        return Some(format!(
            "name part must be no more than {QUALIFIED_NAME_MAX} characters"
        ));
    }
    (!is_qualified_name_part(name)).then(|| {
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
         end with an alphanumeric character (e.g. 'MyName', or 'my.name', or '123-abc')"
            .to_owned()
    })
}

/// Problems with a label value, as `IsValidLabelValue` words them.
pub fn label_value(value: &str) -> Option<String> {
    if value.len() > LABEL_VALUE_MAX {
        return Some(format!("must be no more than {LABEL_VALUE_MAX} characters"));
    }
    (!value.is_empty() && !is_qualified_name_part(value)).then(|| {
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' \
         or '.', and must start and end with an alphanumeric character (e.g. 'MyValue', or \
         'my_value', or '12345')"
            .to_owned()
    })
}

/// Problems with a `host:port` address (DNS name, IPv4, or `[IPv6]`).
pub fn host_port(address: &str) -> Option<String> {
    const FORMAT: &str = "must be host:port, where host is a DNS name, an IPv4 address or a \
                          bracketed IPv6 address and port is 1-65535";
    let Some((host, port)) = address.rsplit_once(':') else {
        return Some(FORMAT.to_owned());
    };
    let port_ok = matches!(port.parse::<u16>(), Ok(p) if p != 0);
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        host.parse::<std::net::Ipv4Addr>().is_ok() || dns1123_subdomain(host).is_none()
    };
    (!(port_ok && host_ok)).then(|| FORMAT.to_owned())
}

/// Problems with a Kind name: CamelCase ASCII, starting with an upper-case letter.
pub fn kind_name(kind: &str) -> Option<String> {
    let ok = kind.len() <= DNS1123_LABEL_MAX
        && kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric());
    (!ok).then(|| "must be a CamelCase kind name, e.g. 'DatabaseTable'".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomains() {
        assert!(dns1123_subdomain("database-table.plugin").is_none());
        assert!(dns1123_subdomain("Upper").is_some());
        assert!(dns1123_subdomain("").is_some());
        assert!(dns1123_subdomain("a..b").is_some());
        assert!(dns1123_subdomain("-a").is_some());
        assert!(dns1123_subdomain(&"a".repeat(254)).is_some());
    }

    #[test]
    fn labels() {
        assert!(label_key("app.kubernetes.io/name").is_none());
        assert!(label_key("tier").is_none());
        assert!(label_key("Bad Key").is_some());
        assert!(label_key("UPPER.example/x").is_some());
        assert!(label_value("").is_none());
        assert!(label_value("PostgreSQL").is_none());
        assert!(label_value("has space").is_some());
        assert!(label_value(&"v".repeat(64)).is_some());
    }

    #[test]
    fn addresses() {
        assert!(host_port("db-plugin.plugins.svc:50051").is_none());
        assert!(host_port("127.0.0.1:1").is_none());
        assert!(host_port("[::1]:50051").is_none());
        assert!(host_port("localhost").is_some());
        assert!(host_port("localhost:0").is_some());
        assert!(host_port("localhost:99999").is_some());
        assert!(host_port("::1:50051").is_some());
        assert!(host_port("bad_host:80").is_some());
    }

    #[test]
    fn kinds() {
        assert!(kind_name("DatabaseTablePostgreSqlExtension").is_none());
        assert!(kind_name("databaseTable").is_some());
        assert!(kind_name("Has-Dash").is_some());
    }
}
