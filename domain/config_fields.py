"""The stack config's field types: each a named `Annotated` type whose validator says what is allowed.

A refusal is a `PydanticCustomError` of type `config` carrying the message and, where the value must
not be printed as given (a URL with credentials), the value to show; domain/config.py turns each
into one line naming the key. Rules that read two fields are model validators on StackConfig.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import urllib.parse
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationInfo
from pydantic_core import PydanticCustomError

from domain import gke_versions, pricing, upgrade_exclusion
from domain.platforms import (
    CPU_MACHINE_SERIES, LOCAL_SSD_SERIES, NCCL_INSTALLER_REPO, PINNED_IMAGE_ARCH, has_digest, is_nccl_installer_url,
    is_pinned_image, is_ray_version,
)

GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
"""Also a DNS-1035 label's grammar (KubeRay's rule for a RayCluster name)."""
MAX_GCE_NAME = 63
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# GCS bucket names: 3-63 characters, or up to 222 with dots and at most 63 between them.
_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")
_IPV4_LIKE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$")
PROJECT_ID = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
QUANTITY = re.compile(r"^[0-9]+(Ki|Mi|Gi|Ti|Pi)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^sha256:[0-9a-f]{64}$")
_CPU_MACHINE = re.compile(r"^(?P<series>[a-z][a-z0-9]*)-(?P<type>[a-z]+)-(?P<vcpus>[1-9][0-9]*)(?P<lssd>-lssd)?$")
# Ranges allowed for the CIDR keys that admit traffic: RFC 1918 and RFC 6598 (shared) space only.
PRIVATE_RANGES = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                          "100.64.0.0/10"))
# An image reference as container registries parse it (github.com/distribution/reference,
# regexp.go and normalize.go): [domain[:port]/]path[:tag][@digest]. The first component is a domain
# only with a '.' or ':' or as localhost; the path is lowercase; a sha256 digest has 64 hex digits.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:localhost(?::[0-9]+)?|{_DOMAIN_PART}(?:\.{_DOMAIN_PART})+(?::[0-9]+)?|{_DOMAIN_PART}:[0-9]+)"
_IMAGE_REFERENCE = re.compile(
    rf"^(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")
_MAX_IMAGE_NAME = 255
# Pulumi's engine parses custom timeouts as Go durations (int64 nanoseconds); Python's threading
# waits (the job provider) stop at the same bound on 64-bit Linux (threading.TIMEOUT_MAX).
_MAX_DURATION_S = (2**63 - 1) // 10**9
MAX_ATTEMPT_RETRIES = 100
"""runMaxRetries and runMaxPreemptions at most: beyond it a run fails for a reason another attempt does not fix."""


def refuse(message: str, **shown: Any) -> PydanticCustomError:
    """A value refused, saying what is allowed; `value=` shows another value than the one given."""
    return PydanticCustomError("config", "{message}", {"message": message, **shown})


def rule(check: Callable[[Any], str | None]) -> AfterValidator:
    """A per-field rule: `check(value)` says what is allowed, or None for a value it allows."""
    def validate(value: Any) -> Any:
        if message := check(value):
            raise refuse(message)
        return value
    return AfterValidator(validate)


def named(pattern: re.Pattern[str], most: int | None, message: str, empty: bool = False) -> AfterValidator:
    """A name matching `pattern`, at most `most` characters (or empty, when `empty`)."""
    return rule(lambda v: None if (empty and not v) or (pattern.match(v) and len(v) <= (most or len(v))) else message)


def cpu_machine_problem(machine: str) -> str | None:
    """What is wrong with a CPU pool machine type, naming the nearest one verl-gke takes; None if it is one
    (`<series>-<type>-<vCPUs>[-lssd]` of domain.platforms.CPU_MACHINE_SERIES; GKE checks the vCPU count)."""
    match = _CPU_MACHINE.match(machine)
    if match and match.group("type") in CPU_MACHINE_SERIES.get(match.group("series"), ()) and (
            not match.group("lssd") or match.group("series") in LOCAL_SSD_SERIES):
        return None
    vcpus = match.group("vcpus") if match else "16"
    known = [f"{series}-{kind}-{vcpus}{lssd}" for series, kinds in CPU_MACHINE_SERIES.items() for kind in kinds
             for lssd in ("", *(("-lssd",) if series in LOCAL_SSD_SERIES else ()))]
    nearest = difflib.get_close_matches(machine, known, n=1, cutoff=0.8)
    many = [s for s, kinds in CPU_MACHINE_SERIES.items() if len(kinds) > 1]
    return ((f"did you mean {nearest[0]}? " if nearest else "")
            + "A Compute Engine machine type <series>-<type>-<vCPUs> of an x86 series: "
            + ", ".join(f"{s} ({', '.join(kinds)})" for s, kinds in CPU_MACHINE_SERIES.items() if len(kinds) == 1)
            + f", {', '.join(many)} ({', '.join(CPU_MACHINE_SERIES[many[0]])}); "
            + f"{', '.join(LOCAL_SSD_SERIES[:-1])} and {LOCAL_SSD_SERIES[-1]} also with -lssd.")


def is_image_reference(image: str) -> bool:
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    name = name[:len(name) - len(last)] + last.split(":", 1)[0]  # without the tag
    return bool(_IMAGE_REFERENCE.match(image)) and len(name) <= _MAX_IMAGE_NAME


def _image_problem(image: str) -> str | None:
    if not is_image_reference(image):
        return ("an image reference such as verlai/verl:vllm011.dev7 or registry.example.com/team/verl@sha256:<64 "
                "hex>: lowercase path, tag of letters, digits, '_', '.', '-'.")
    if not is_pinned_image(image):
        return "an image with a fixed tag (not latest) or an @sha256 digest."
    if image not in PINNED_IMAGE_ARCH and not has_digest(image):
        return ("an image of your own must be pinned by digest (name@sha256:<64 hex>): a tag can be moved to other "
                "code that then runs on every node.")
    return None


def _bucket_name_ok(name: str) -> bool:
    parts = name.split(".")
    return (bool(_BUCKET.match(name)) and (len(name) <= MAX_GCE_NAME or "." in name)
            and all(0 < len(part) <= MAX_GCE_NAME for part in parts) and not _IPV4_LIKE.match(name)
            and not name.startswith("goog") and "google" not in name and "g00gle" not in name)


def without_credentials(url: str) -> str:
    """`url` with any user info, query or fragment blanked out, so that a message never prints a credential."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "[unparsable URL]"
    netloc = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc:
        netloc = f"***@{netloc}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "",
                                    "***" if parts.fragment else ""))


def host_and_port(url: str) -> tuple[str, int]:
    """The host and TCP port of an http(s) URL (the scheme's port if it names none); ValueError if it names neither."""
    parts = urllib.parse.urlsplit(url)
    port = {"http": 80, "https": 443}.get(parts.scheme) if parts.port is None else parts.port  # ValueError >65535
    if not parts.hostname or not port:
        raise ValueError(f"no host and port in {without_credentials(url)}")
    return parts.hostname, port


def _server_url(url: str) -> bool:
    try:
        host_and_port(url)
    except ValueError:
        return False
    return True


def _url(check: Callable[[str], str | None]) -> AfterValidator:
    """A URL rule whose refusal shows the URL without its credentials."""
    def validate(url: str) -> str:
        if url and (message := check(url)):
            raise refuse(message, value=without_credentials(url))
        return url
    return AfterValidator(validate)


def _dashboard_url_problem(url: str) -> str | None:
    if not re.match(r"^https://[^\s/]+", url):
        return ("an https URL of a privately reachable Ray dashboard behind a TLS front (plain http carries the jobs, "
                "and with token authentication the token, in clear).")
    if without_credentials(url) != url:
        return ("no credentials in the URL (user info, query or fragment): they would be stored in clear in the "
                "job's inputs. Reach the dashboard through a private network instead.")
    return None


def _cidr(private: bool) -> AfterValidator:
    def check(text: str) -> str | None:
        try:
            net = ipaddress.IPv4Network(text)
        except ValueError:
            return "an IPv4 CIDR such as 192.168.1.0/24."
        if private and not any(net.subnet_of(r) for r in PRIVATE_RANGES):
            return ("a private range (inside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or 100.64.0.0/10): this key "
                    "admits traffic, never from the internet.")
        return None
    return rule(check)


def _duration(unit_s: int) -> AfterValidator:
    return rule(lambda v: f"at most {_MAX_DURATION_S // unit_s}: the Pulumi engine's longest duration (about 292 "
                "years)." if v * unit_s > _MAX_DURATION_S else None)


def _exclusion_start(start: str, info: ValidationInfo) -> str:
    """Judged against the context's `now` (tests), else the clock."""
    now = (info.context or {}).get("now") or datetime.now(timezone.utc)
    if message := upgrade_exclusion.start_problem(start, now):
        raise refuse(message)
    return start


ProjectId = Annotated[str, named(PROJECT_ID, 30, "a GCP project id: 6-30 lowercase letters, digits or hyphens, "
                                 "starting with a letter.")]
ClusterName = Annotated[str, named(GCE_NAME, 40, "1-40 lowercase letters, digits or hyphens, starting with a letter.")]
KubernetesVersion = Annotated[str, rule(lambda v: None if not v or gke_versions.is_version(v) else
                                        "empty (the channel's choice), a minor such as 1.35, or a GKE version such "
                                        "as 1.34.1-gke.1829001.")]
ExclusionStart = Annotated[str, AfterValidator(_exclusion_start)]
CpuMachineType = Annotated[str, rule(cpu_machine_problem)]
VpcName = Annotated[str, named(GCE_NAME, MAX_GCE_NAME, "empty (a VPC of the stack's own) or the name of an existing "
                               "VPC of the project, such as default.", empty=True)]


def network_prefix(suffix: str) -> AfterValidator:
    """A prefix of VPC names ending in `suffix`, which must fit a GCE name."""
    most = MAX_GCE_NAME - len(suffix)
    return named(GCE_NAME, most, f"lowercase letters, digits or hyphens starting with a letter, at most {most} "
                 "characters.", empty=True)


Cidr = Annotated[str, _cidr(private=False)]
PrivateCidr = Annotated[str, _cidr(private=True)]
"""A range that admits traffic."""
Namespace = Annotated[str, named(_DNS_LABEL, 63, "a Kubernetes namespace: at most 63 lowercase letters, digits or "
                                 "hyphens.")]
# The staging Job's account is this name with `-staging` (domain.names).
ServiceAccount = Annotated[str, named(_DNS_SUBDOMAIN, 245, "a Kubernetes name: lowercase letters, digits, '-' or "
                                      "'.', at most 245 characters.", empty=True)]
# KubeRay derives "<name>-head-svc" and pod names from it; keep room under 63.
RayClusterName = Annotated[str, named(GCE_NAME, 47, "at most 47 lowercase letters, digits or hyphens, starting with a "
                                      "letter and ending with a letter or digit (KubeRay wants a DNS-1035 label).")]
# Empty: derived from the stack and the project (domain.names).
BucketName = Annotated[str, rule(lambda v: None if not v or _bucket_name_ok(v) else
                                 "a GCS bucket name: 3-63 lowercase letters, digits, '-', '_' or '.' (up to 222 with "
                                 "dots, 63 between dots), starting and ending with a letter or digit, not an IP "
                                 "address, not starting with 'goog' or containing 'google'.")]
Quantity = Annotated[str, named(QUANTITY, None, "a Kubernetes quantity such as 768Gi.")]
Commit = Annotated[str, named(_COMMIT, 40, "a 40-hex commit of the Hugging Face repo, so staging is reproducible.")]
Image = Annotated[str, rule(_image_problem)]
NcclInstallerUrl = Annotated[str, _url(lambda v: None if is_nccl_installer_url(v) else
                                       f"a manifest of Google's installers at a commit: {NCCL_INSTALLER_REPO}/<40-hex "
                                       "commit>/gpudirect-rdma/<file>.yaml (no branch, tag, other host or repository, "
                                       "query or fragment).")]
DashboardUrl = Annotated[str, _url(_dashboard_url_problem)]
# The Ray pods' egress policy admits its port (manifests/network_policy.py).
MlflowUri = Annotated[str, _url(lambda v: None if re.match(r"^https?://[^\s/]+", v) and without_credentials(v) == v
                                and _server_url(v) else "an http:// or https:// URL of an MLflow tracking server: a "
                                "host, a port from 1 to 65535 if not the scheme's, no credentials (they would be in "
                                "the job's command and Pulumi's state).")]
RayVersion = Annotated[str, rule(lambda v: None if not v or is_ray_version(v) else
                                 "the Ray version inside verlImage, X.Y.Z such as 2.54.0.")]
Seconds = Annotated[int, _duration(1)]
Minutes = Annotated[int, _duration(60)]
Hours = Annotated[int, _duration(3600)]
Attempts = Annotated[int, Field(ge=0), rule(lambda v: f"at most {MAX_ATTEMPT_RETRIES}: a run that needs more attempts "
                                            "fails for a reason another attempt cannot fix, and each one restarts from "
                                            "the last checkpoint on GPUs that are paid for."
                                            if v > MAX_ATTEMPT_RETRIES else None)]
NodePrices = Annotated[dict[pricing.CapacityKind, float], rule(
    lambda prices: f"each price more than 0 and at most {pricing.MAX_NODE_USD_PER_HOUR:g} USD per GPU node-hour (A3 "
    "Ultra's list price is $83.49)." if any(not 0 < usd <= pricing.MAX_NODE_USD_PER_HOUR for usd in prices.values())
    else None)]
"""capacity kind -> the user's price of one GPU node per hour (domain.pricing.PRICE_KEY)."""
