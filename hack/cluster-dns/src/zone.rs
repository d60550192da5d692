//! What the cluster's DNS answers, computed from Services and Endpoints
//! alone: no IO here, so that every rule is unit-tested.
//!
//! The names are those of Kubernetes' DNS specification, as CoreDNS's
//! `kubernetes` plugin serves them (`DOMAIN` is e.g. `cluster.local`):
//!
//! - `<svc>.<ns>.svc.DOMAIN`: the Service's cluster IPs (A / AAAA), whether
//!   or not it has Endpoints;
//! - for a headless Service (`clusterIP: None`), the same name has one
//!   record per address in its Endpoints' `subsets[].addresses`, and each
//!   address also has a name of its own, `<host>.<svc>.<ns>.svc.DOMAIN`,
//!   where `<host>` is the address's `hostname`, or else its IP with dashes
//!   (`10-244-0-5`); a headless Service with no address has no name;
//! - an ExternalName Service is a CNAME to its `externalName` (followed
//!   when the target is in the domain itself);
//! - `DOMAIN` has an SOA record; `svc.DOMAIN` and `<ns>.svc.DOMAIN` exist
//!   (no records) while some Service is under them;
//! - any other name in the domain does not exist (NXDOMAIN), and names
//!   outside it are refused: nothing is forwarded.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use hickory_proto::rr::rdata::{A, AAAA, CNAME, SOA};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{Endpoints, Service};

/// How long a CNAME chain inside the domain may be before the lookup gives
/// up (ExternalName Services may point at each other in a loop).
const MAX_CNAME_CHAIN: usize = 8;

/// The records of one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A Service with cluster IPs (type ClusterIP, NodePort, LoadBalancer).
    ClusterIp(Vec<IpAddr>),
    /// A headless Service with at least one address: `all` of them for the
    /// Service's name, and by host name for the names below it.
    Headless {
        all: Vec<IpAddr>,
        hosts: BTreeMap<String, Vec<IpAddr>>,
    },
    /// An ExternalName Service: a CNAME to this name.
    ExternalName(Name),
}

/// The response code of a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rcode {
    /// The name exists; the answers may still be empty (NODATA).
    NoError,
    /// The name is in the domain and does not exist.
    NxDomain,
    /// The name is not in the domain: this server answers for nothing else.
    Refused,
    /// A CNAME chain inside the domain is too long (a loop).
    ServFail,
}

/// The answer to one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub rcode: Rcode,
    /// The answer section.
    pub answers: Vec<Record>,
    /// The domain's SOA for the authority section, with NXDOMAIN and NODATA
    /// answers (it gives resolvers the time to cache the negative answer).
    pub soa: Option<Record>,
}

impl Answer {
    fn refused() -> Self {
        Self {
            rcode: Rcode::Refused,
            answers: Vec::new(),
            soa: None,
        }
    }
}

/// Whether `name` is `domain` or below it (case-insensitive).
pub fn in_domain(domain: &Name, name: &Name) -> bool {
    domain.zone_of(name)
}

/// What a name in the domain is.
enum Node<'z> {
    /// The domain itself.
    Apex,
    /// A name that exists only because names below it do.
    Empty,
    /// A name with addresses.
    Addresses(&'z [IpAddr]),
    /// A name that is an alias.
    Alias(&'z Name),
    /// No such name.
    Missing,
}

/// Every name the server answers for, from the Services and Endpoints of
/// the whole cluster at one moment.
#[derive(Debug, Clone)]
pub struct Zone {
    domain: Name,
    ttl: u32,
    serial: u32,
    /// namespace → service name → records.
    services: BTreeMap<String, BTreeMap<String, Entry>>,
    /// What was left out and why, one line each (logged by the caller).
    problems: Vec<String>,
}

impl Zone {
    /// The zone of `domain` (e.g. `cluster.local`) for these Services and
    /// Endpoints; every record has the time-to-live `ttl` (seconds), which
    /// is also the SOA's minimum (how long a negative answer is cached).
    /// `serial` is the SOA's serial.
    pub fn build<'a>(
        domain: &Name,
        ttl: u32,
        serial: u32,
        services: impl IntoIterator<Item = &'a Service>,
        endpoints: impl IntoIterator<Item = &'a Endpoints>,
    ) -> Self {
        let mut domain = domain.to_lowercase();
        domain.set_fqdn(true);
        let endpoints: HashMap<(&str, &str), &Endpoints> = endpoints
            .into_iter()
            .filter_map(|e| {
                Some((
                    (
                        e.metadata.namespace.as_deref()?,
                        e.metadata.name.as_deref()?,
                    ),
                    e,
                ))
            })
            .collect();
        let mut zone = Self {
            domain,
            ttl,
            serial,
            services: BTreeMap::new(),
            problems: Vec::new(),
        };
        for service in services {
            let (Some(namespace), Some(name)) = (
                service.metadata.namespace.as_deref(),
                service.metadata.name.as_deref(),
            ) else {
                continue;
            };
            let entry = match service_entry(
                service,
                endpoints.get(&(namespace, name)).copied(),
                &mut zone.problems,
            ) {
                Some(entry) => entry,
                None => continue,
            };
            zone.services
                .entry(namespace.to_ascii_lowercase())
                .or_default()
                .insert(name.to_ascii_lowercase(), entry);
        }
        zone
    }

    /// The domain this zone answers for (lowercase, fully qualified).
    pub fn domain(&self) -> &Name {
        &self.domain
    }

    /// How many Services have a name.
    pub fn service_count(&self) -> usize {
        self.services.values().map(BTreeMap::len).sum()
    }

    /// What the Services and Endpoints had that the zone leaves out (an IP
    /// that does not parse, an ExternalName that is no DNS name).
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// Whether both zones have the same records (the serial aside).
    pub fn same_records(&self, other: &Self) -> bool {
        self.domain == other.domain && self.ttl == other.ttl && self.services == other.services
    }

    /// The answer to the question `name`, `qtype` (class IN).
    pub fn lookup(&self, name: &Name, qtype: RecordType) -> Answer {
        if !in_domain(&self.domain, name) {
            return Answer::refused();
        }
        let mut owner = name.to_lowercase();
        owner.set_fqdn(true);
        let mut answers = Vec::new();
        for _ in 0..MAX_CNAME_CHAIN {
            let rcode = match self.node(&owner) {
                Node::Missing => Rcode::NxDomain,
                Node::Empty => Rcode::NoError,
                Node::Apex => {
                    if matches!(qtype, RecordType::SOA | RecordType::ANY) {
                        answers.push(self.soa());
                    }
                    Rcode::NoError
                }
                Node::Addresses(addresses) => {
                    answers.extend(
                        addresses
                            .iter()
                            .filter_map(|ip| self.address_record(&owner, *ip, qtype)),
                    );
                    Rcode::NoError
                }
                Node::Alias(target) => {
                    answers.push(Record::from_rdata(
                        owner.clone(),
                        self.ttl,
                        RData::CNAME(CNAME(target.clone())),
                    ));
                    if matches!(qtype, RecordType::CNAME | RecordType::ANY)
                        || !in_domain(&self.domain, target)
                    {
                        // Outside the domain the client follows the alias
                        // itself (and this server refuses it).
                        Rcode::NoError
                    } else {
                        owner = target.to_lowercase();
                        continue;
                    }
                }
            };
            let soa = answers.is_empty().then(|| self.soa());
            return Answer {
                rcode,
                answers,
                soa,
            };
        }
        Answer {
            rcode: Rcode::ServFail,
            answers: Vec::new(),
            soa: None,
        }
    }

    /// The domain's SOA record.
    pub fn soa(&self) -> Record {
        // The domain and two short labels: a valid name for any domain
        // that leaves room for them (else the domain itself).
        let under = |labels: &[&str]| {
            labels
                .iter()
                .rev()
                .try_fold(self.domain.clone(), |name, label| {
                    name.prepend_label(*label)
                })
                .unwrap_or_else(|_| self.domain.clone())
        };
        Record::from_rdata(
            self.domain.clone(),
            self.ttl,
            RData::SOA(SOA::new(
                under(&["ns", "dns"]),
                under(&["hostmaster"]),
                self.serial,
                7200,
                1800,
                86400,
                self.ttl,
            )),
        )
    }

    fn address_record(&self, owner: &Name, ip: IpAddr, qtype: RecordType) -> Option<Record> {
        let rdata = match (ip, qtype) {
            (IpAddr::V4(ip), RecordType::A | RecordType::ANY) => RData::A(A(ip)),
            (IpAddr::V6(ip), RecordType::AAAA | RecordType::ANY) => RData::AAAA(AAAA(ip)),
            _ => return None,
        };
        Some(Record::from_rdata(owner.clone(), self.ttl, rdata))
    }

    /// What `name` (in the domain, lowercase) is.
    fn node(&self, name: &Name) -> Node<'_> {
        // (num_labels() would not count a leading `*`.)
        let below = name
            .iter()
            .count()
            .saturating_sub(self.domain.iter().count());
        // The labels below the domain, nearest the domain first:
        // svc, <ns>, <svc>, <host>.
        let labels: Vec<&[u8]> = name.iter().take(below).collect();
        let label = |i: usize| -> Option<&str> {
            labels
                .len()
                .checked_sub(i + 1)
                .and_then(|at| labels.get(at))
                .and_then(|l| std::str::from_utf8(l).ok())
        };
        if labels.is_empty() {
            return Node::Apex;
        }
        if label(0) != Some("svc") {
            return Node::Missing;
        }
        if labels.len() == 1 {
            return if self.services.is_empty() {
                Node::Missing
            } else {
                Node::Empty
            };
        }
        let Some(namespace) = label(1).and_then(|ns| self.services.get(ns)) else {
            return Node::Missing;
        };
        if labels.len() == 2 {
            return Node::Empty;
        }
        let Some(entry) = label(2).and_then(|svc| namespace.get(svc)) else {
            return Node::Missing;
        };
        match (entry, labels.len()) {
            (Entry::ClusterIp(ips), 3) => Node::Addresses(ips),
            (Entry::Headless { all, .. }, 3) => Node::Addresses(all),
            (Entry::ExternalName(target), 3) => Node::Alias(target),
            (Entry::Headless { hosts, .. }, 4) => match label(3).and_then(|h| hosts.get(h)) {
                Some(ips) => Node::Addresses(ips),
                None => Node::Missing,
            },
            _ => Node::Missing,
        }
    }
}

/// The records of `service` (with its Endpoints, if any), or `None` when it
/// has no name: a headless Service without addresses, or one whose data do
/// not make records (noted in `problems`).
fn service_entry(
    service: &Service,
    endpoints: Option<&Endpoints>,
    problems: &mut Vec<String>,
) -> Option<Entry> {
    let key = format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    );
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        let target = spec.external_name.as_deref().unwrap_or_default();
        return match Name::from_ascii(target) {
            Ok(mut name) if !target.is_empty() => {
                name.set_fqdn(true);
                Some(Entry::ExternalName(name.to_lowercase()))
            }
            _ => {
                problems.push(format!(
                    "Service {key}: externalName {target:?} is not a DNS name"
                ));
                None
            }
        };
    }
    let cluster_ips: Vec<&str> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.iter().map(String::as_str).collect(),
        (_, Some(ip)) => vec![ip.as_str()],
        _ => Vec::new(),
    };
    if cluster_ips.contains(&"None") {
        return headless_entry(&key, endpoints, problems);
    }
    let mut ips = Vec::new();
    for ip in cluster_ips.iter().filter(|ip| !ip.is_empty()) {
        match ip.parse::<IpAddr>() {
            Ok(ip) => ips.push(ip),
            Err(_) => problems.push(format!("Service {key}: cluster IP {ip:?} is no IP")),
        }
    }
    ips.sort_unstable();
    ips.dedup();
    (!ips.is_empty()).then_some(Entry::ClusterIp(ips))
}

fn headless_entry(
    key: &str,
    endpoints: Option<&Endpoints>,
    problems: &mut Vec<String>,
) -> Option<Entry> {
    let mut all = Vec::new();
    let mut hosts: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    let addresses = endpoints
        .and_then(|e| e.subsets.as_deref())
        .unwrap_or_default()
        .iter()
        .flat_map(|subset| subset.addresses.as_deref().unwrap_or_default());
    for address in addresses {
        let Ok(ip) = address.ip.parse::<IpAddr>() else {
            problems.push(format!(
                "Endpoints {key}: address {:?} is no IP",
                address.ip
            ));
            continue;
        };
        let host = match address.hostname.as_deref() {
            Some(host) if !host.is_empty() => host.to_ascii_lowercase(),
            _ => dashed(ip),
        };
        all.push(ip);
        hosts.entry(host).or_default().push(ip);
    }
    if all.is_empty() {
        return None;
    }
    all.sort_unstable();
    all.dedup();
    for ips in hosts.values_mut() {
        ips.sort_unstable();
        ips.dedup();
    }
    Some(Entry::Headless { all, hosts })
}

/// The name CoreDNS gives an address without a hostname: its IP with
/// dashes for dots (or colons).
fn dashed(ip: IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, ServiceSpec};
    use kube::api::ObjectMeta;

    use super::*;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).expect("a test name")
    }

    fn meta(namespace: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        }
    }

    fn cluster_ip(namespace: &str, svc: &str, ip: &str) -> Service {
        Service {
            metadata: meta(namespace, svc),
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.to_owned()),
                cluster_ips: Some(vec![ip.to_owned()]),
                type_: Some("ClusterIP".to_owned()),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    fn headless(namespace: &str, svc: &str) -> Service {
        cluster_ip(namespace, svc, "None")
    }

    fn external(namespace: &str, svc: &str, target: &str) -> Service {
        Service {
            metadata: meta(namespace, svc),
            spec: Some(ServiceSpec {
                type_: Some("ExternalName".to_owned()),
                external_name: Some(target.to_owned()),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    /// Endpoints with one subset per slice of (ip, hostname).
    fn endpoints(namespace: &str, svc: &str, subsets: &[&[(&str, Option<&str>)]]) -> Endpoints {
        Endpoints {
            metadata: meta(namespace, svc),
            subsets: Some(
                subsets
                    .iter()
                    .map(|addresses| EndpointSubset {
                        addresses: Some(
                            addresses
                                .iter()
                                .map(|(ip, host)| EndpointAddress {
                                    ip: (*ip).to_owned(),
                                    hostname: host.map(str::to_owned),
                                    ..EndpointAddress::default()
                                })
                                .collect(),
                        ),
                        ..EndpointSubset::default()
                    })
                    .collect(),
            ),
        }
    }

    fn zone(services: &[Service], endpoints: &[Endpoints]) -> Zone {
        Zone::build(&name("cluster.local"), 5, 1, services, endpoints)
    }

    /// The answer's records as text, e.g. `"a.b.svc.cluster.local. A 10.0.0.1"`.
    fn records(answer: &Answer) -> Vec<String> {
        answer
            .answers
            .iter()
            .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
            .collect()
    }

    fn ask(zone: &Zone, qname: &str, qtype: RecordType) -> (Rcode, Vec<String>) {
        let answer = zone.lookup(&name(qname), qtype);
        (answer.rcode, records(&answer))
    }

    #[test]
    fn a_cluster_ip_service_is_its_cluster_ip_with_or_without_endpoints() {
        let zone = zone(&[cluster_ip("default", "web", "10.96.0.20")], &[]);
        assert_eq!(
            ask(&zone, "web.default.svc.cluster.local.", RecordType::A),
            (
                Rcode::NoError,
                vec!["web.default.svc.cluster.local. A 10.96.0.20".to_owned()]
            )
        );
        // DNS names are case-insensitive.
        assert_eq!(
            ask(&zone, "WEB.Default.SVC.cluster.LOCAL", RecordType::A),
            (
                Rcode::NoError,
                vec!["web.default.svc.cluster.local. A 10.96.0.20".to_owned()]
            )
        );
        // The name exists: another type is NODATA (NOERROR, no answer, the
        // SOA for negative caching), not NXDOMAIN.
        let aaaa = zone.lookup(&name("web.default.svc.cluster.local."), RecordType::AAAA);
        assert_eq!((aaaa.rcode, aaaa.answers.len()), (Rcode::NoError, 0));
        assert_eq!(
            aaaa.soa.map(|r| r.record_type()),
            Some(RecordType::SOA),
            "NODATA carries the SOA"
        );
        // A ClusterIP Service's Endpoints make no names.
        let with_endpoints = super::Zone::build(
            &name("cluster.local"),
            5,
            1,
            &[cluster_ip("default", "web", "10.96.0.20")],
            &[endpoints(
                "default",
                "web",
                &[&[("10.244.0.7", Some("pod"))]],
            )],
        );
        assert_eq!(
            ask(
                &with_endpoints,
                "web.default.svc.cluster.local",
                RecordType::A
            )
            .1,
            vec!["web.default.svc.cluster.local. A 10.96.0.20".to_owned()]
        );
        assert_eq!(
            ask(
                &with_endpoints,
                "pod.web.default.svc.cluster.local",
                RecordType::A
            )
            .0,
            Rcode::NxDomain
        );
    }

    #[test]
    fn a_dual_stack_service_has_a_and_aaaa() {
        let mut service = cluster_ip("default", "web", "10.96.0.20");
        if let Some(spec) = service.spec.as_mut() {
            spec.cluster_ips = Some(vec!["10.96.0.20".to_owned(), "fd00::20".to_owned()]);
        }
        let zone = zone(&[service], &[]);
        let owner = "web.default.svc.cluster.local.";
        assert_eq!(
            ask(&zone, owner, RecordType::AAAA).1,
            vec![format!("{owner} AAAA fd00::20")]
        );
        assert_eq!(
            ask(&zone, owner, RecordType::ANY).1,
            vec![
                format!("{owner} A 10.96.0.20"),
                format!("{owner} AAAA fd00::20")
            ]
        );
    }

    #[test]
    fn a_headless_service_is_every_address_and_each_address_has_a_name() {
        let zone = zone(
            &[headless("db", "mysql")],
            &[endpoints(
                "db",
                "mysql",
                &[
                    &[
                        ("10.244.0.12", Some("mysql-1")),
                        ("10.244.0.11", Some("mysql-0")),
                    ],
                    // A second subset (other ports), one address without a
                    // hostname, one listed twice.
                    &[("10.244.0.13", None), ("10.244.0.11", Some("mysql-0"))],
                ],
            )],
        );
        let owner = "mysql.db.svc.cluster.local.";
        assert_eq!(
            ask(&zone, owner, RecordType::A),
            (
                Rcode::NoError,
                vec![
                    format!("{owner} A 10.244.0.11"),
                    format!("{owner} A 10.244.0.12"),
                    format!("{owner} A 10.244.0.13"),
                ]
            )
        );
        assert_eq!(
            ask(&zone, "mysql-0.mysql.db.svc.cluster.local", RecordType::A).1,
            vec!["mysql-0.mysql.db.svc.cluster.local. A 10.244.0.11".to_owned()]
        );
        assert_eq!(
            ask(&zone, "mysql-1.mysql.db.svc.cluster.local", RecordType::A).1,
            vec!["mysql-1.mysql.db.svc.cluster.local. A 10.244.0.12".to_owned()]
        );
        // Without a hostname, the address's name is its IP with dashes.
        assert_eq!(
            ask(
                &zone,
                "10-244-0-13.mysql.db.svc.cluster.local",
                RecordType::A
            )
            .1,
            vec!["10-244-0-13.mysql.db.svc.cluster.local. A 10.244.0.13".to_owned()]
        );
        assert_eq!(
            ask(&zone, "mysql-2.mysql.db.svc.cluster.local", RecordType::A).0,
            Rcode::NxDomain
        );
        assert_eq!(
            ask(&zone, "a.mysql-0.mysql.db.svc.cluster.local", RecordType::A).0,
            Rcode::NxDomain
        );
    }

    #[test]
    fn an_ipv6_address_without_hostname_gets_a_dashed_name() {
        let zone = zone(
            &[headless("db", "mysql")],
            &[endpoints("db", "mysql", &[&[("fd00::5", None)]])],
        );
        assert_eq!(
            ask(
                &zone,
                "fd00--5.mysql.db.svc.cluster.local",
                RecordType::AAAA
            )
            .1,
            vec!["fd00--5.mysql.db.svc.cluster.local. AAAA fd00::5".to_owned()]
        );
        assert_eq!(
            ask(&zone, "mysql.db.svc.cluster.local", RecordType::A),
            (Rcode::NoError, vec![])
        );
    }

    #[test]
    fn a_headless_service_without_addresses_has_no_name() {
        // No Endpoints at all, Endpoints without subsets, and a subset with
        // only not-ready addresses: CoreDNS answers NXDOMAIN for all three.
        let not_ready = Endpoints {
            metadata: meta("db", "empty"),
            subsets: Some(vec![EndpointSubset {
                not_ready_addresses: Some(vec![EndpointAddress {
                    ip: "10.244.0.9".to_owned(),
                    ..EndpointAddress::default()
                }]),
                ..EndpointSubset::default()
            }]),
        };
        let zone = zone(
            &[
                headless("db", "none"),
                headless("db", "nosubsets"),
                headless("db", "empty"),
            ],
            &[
                Endpoints {
                    metadata: meta("db", "nosubsets"),
                    subsets: None,
                },
                not_ready,
            ],
        );
        for svc in ["none", "nosubsets", "empty"] {
            let answer = zone.lookup(&name(&format!("{svc}.db.svc.cluster.local")), RecordType::A);
            assert_eq!(answer.rcode, Rcode::NxDomain, "{svc}");
            assert_eq!(
                answer.soa.map(|r| r.record_type()),
                Some(RecordType::SOA),
                "{svc}: NXDOMAIN carries the SOA"
            );
        }
        // With no named Service in it, the namespace has no name either.
        assert_eq!(
            ask(&zone, "db.svc.cluster.local", RecordType::A).0,
            Rcode::NxDomain
        );
        assert_eq!(zone.service_count(), 0);
    }

    #[test]
    fn endpoints_follow_the_service_of_the_same_namespace_and_name() {
        let zone = zone(
            &[headless("a", "db"), headless("b", "db")],
            &[endpoints("b", "db", &[&[("10.244.0.2", None)]])],
        );
        assert_eq!(
            ask(&zone, "db.a.svc.cluster.local", RecordType::A).0,
            Rcode::NxDomain
        );
        assert_eq!(
            ask(&zone, "db.b.svc.cluster.local", RecordType::A).1,
            vec!["db.b.svc.cluster.local. A 10.244.0.2".to_owned()]
        );
    }

    #[test]
    fn an_external_name_service_is_a_cname() {
        let zone = zone(
            &[
                external("default", "search", "search.example.com"),
                external("default", "alias", "web.default.svc.cluster.local."),
                cluster_ip("default", "web", "10.96.0.20"),
                external("default", "loop1", "loop2.default.svc.cluster.local"),
                external("default", "loop2", "loop1.default.svc.cluster.local"),
            ],
            &[],
        );
        assert_eq!(
            ask(&zone, "search.default.svc.cluster.local", RecordType::A),
            (
                Rcode::NoError,
                vec!["search.default.svc.cluster.local. CNAME search.example.com.".to_owned()]
            )
        );
        // Inside the domain the server follows the alias itself.
        assert_eq!(
            ask(&zone, "alias.default.svc.cluster.local", RecordType::A),
            (
                Rcode::NoError,
                vec![
                    "alias.default.svc.cluster.local. CNAME web.default.svc.cluster.local."
                        .to_owned(),
                    "web.default.svc.cluster.local. A 10.96.0.20".to_owned(),
                ]
            )
        );
        assert_eq!(
            ask(&zone, "alias.default.svc.cluster.local", RecordType::CNAME).1,
            vec![
                "alias.default.svc.cluster.local. CNAME web.default.svc.cluster.local.".to_owned()
            ]
        );
        assert_eq!(
            ask(&zone, "loop1.default.svc.cluster.local", RecordType::A),
            (Rcode::ServFail, vec![])
        );
    }

    #[test]
    fn names_outside_the_domain_are_refused() {
        let zone = zone(&[cluster_ip("default", "web", "10.96.0.20")], &[]);
        for outside in [
            "example.com.",
            "web.default.svc.cluster.local.example.com.",
            "local.",
            "cluster.locals.",
            "xcluster.local.",
            ".",
            "20.0.96.10.in-addr.arpa.",
        ] {
            let answer = zone.lookup(&name(outside), RecordType::A);
            assert_eq!(
                answer,
                Answer {
                    rcode: Rcode::Refused,
                    answers: vec![],
                    soa: None
                },
                "{outside}"
            );
        }
        // A label holding an escaped dot is one label, not two.
        let tricky = Name::from_labels(vec![b"web.cluster".as_slice(), b"local".as_slice()])
            .expect("a name of two labels");
        assert_eq!(zone.lookup(&tricky, RecordType::A).rcode, Rcode::Refused);
        assert!(!in_domain(zone.domain(), &tricky));
    }

    #[test]
    fn names_in_the_domain_that_do_not_exist_are_nxdomain() {
        let zone = zone(&[cluster_ip("default", "web", "10.96.0.20")], &[]);
        for missing in [
            "nope.default.svc.cluster.local.",
            "web.other.svc.cluster.local.",
            "web.default.pod.cluster.local.",
            "web.cluster.local.",
            "x.web.default.svc.cluster.local.",
            // What a pod's search list makes of `example.com`.
            "example.com.default.svc.cluster.local.",
            "example.com.svc.cluster.local.",
            "example.com.cluster.local.",
        ] {
            assert_eq!(
                ask(&zone, missing, RecordType::A),
                (Rcode::NxDomain, vec![]),
                "{missing}"
            );
        }
    }

    #[test]
    fn names_above_a_service_exist_without_records() {
        let zone = zone(&[cluster_ip("default", "web", "10.96.0.20")], &[]);
        for empty in ["default.svc.cluster.local.", "svc.cluster.local."] {
            assert_eq!(
                ask(&zone, empty, RecordType::A),
                (Rcode::NoError, vec![]),
                "{empty}"
            );
        }
        let apex = zone.lookup(&name("cluster.local."), RecordType::SOA);
        assert_eq!(apex.rcode, Rcode::NoError);
        assert_eq!(
            records(&apex),
            vec![
                "cluster.local. SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"
                    .to_owned()
            ]
        );
        let empty = Zone::build(&name("cluster.local"), 5, 1, &[], &[]);
        assert_eq!(
            ask(&empty, "svc.cluster.local.", RecordType::A).0,
            Rcode::NxDomain
        );
    }

    #[test]
    fn another_domain_and_ttl() {
        let zone = Zone::build(
            &name("Kplug.Test"),
            30,
            1,
            &[cluster_ip("default", "web", "10.96.0.20")],
            &[],
        );
        let answer = zone.lookup(&name("web.default.svc.kplug.test"), RecordType::A);
        assert_eq!(
            answer.answers.first().map(|r| (r.ttl, r.data.clone())),
            Some((30, RData::A(A(Ipv4Addr::new(10, 96, 0, 20)))))
        );
        assert_eq!(
            zone.lookup(&name("web.default.svc.cluster.local"), RecordType::A)
                .rcode,
            Rcode::Refused
        );
    }

    #[test]
    fn bad_data_is_left_out_and_reported() {
        let zone = zone(
            &[
                cluster_ip("default", "bad", "10.96.0.300"),
                external("default", "nameless", ""),
                headless("default", "hl"),
                // Not allocated yet: no records, nothing to report.
                cluster_ip("default", "pending", ""),
            ],
            &[endpoints(
                "default",
                "hl",
                &[&[("10.244.0.1", None), ("not-an-ip", Some("x"))]],
            )],
        );
        assert_eq!(
            ask(&zone, "bad.default.svc.cluster.local", RecordType::A).0,
            Rcode::NxDomain
        );
        assert_eq!(
            ask(&zone, "pending.default.svc.cluster.local", RecordType::A).0,
            Rcode::NxDomain
        );
        assert_eq!(
            ask(&zone, "hl.default.svc.cluster.local", RecordType::A).1,
            vec!["hl.default.svc.cluster.local. A 10.244.0.1".to_owned()]
        );
        assert_eq!(
            zone.problems(),
            [
                "Service default/bad: cluster IP \"10.96.0.300\" is no IP",
                "Service default/nameless: externalName \"\" is not a DNS name",
                "Endpoints default/hl: address \"not-an-ip\" is no IP",
            ]
        );
    }

    #[test]
    fn same_records_ignores_the_serial() {
        let services = [cluster_ip("default", "web", "10.96.0.20")];
        let one = Zone::build(&name("cluster.local"), 5, 1, &services, &[]);
        let two = Zone::build(&name("cluster.local"), 5, 2, &services, &[]);
        assert!(one.same_records(&two));
        let other = Zone::build(
            &name("cluster.local"),
            5,
            1,
            &[cluster_ip("default", "web", "10.96.0.21")],
            &[],
        );
        assert!(!one.same_records(&other));
    }
}
