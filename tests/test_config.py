"""Every validation rule of the stack config, with a good and a bad case each."""

from __future__ import annotations

import json

import pytest

from domain.config import ConfigError, load_config, placeholders
from tests.conftest import BASE_CONFIG, verl_value

A = "actor_rollout_ref.actor."


def json_list(items) -> str:
    return json.dumps(list(items))


def config(**changes: str) -> dict[str, str]:
    raw = dict(BASE_CONFIG)
    for key, value in changes.items():
        full = key.replace("__", ":")
        raw[full if ":" in full else f"verl-gke:{full}"] = value
    return raw


def problems(**changes: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(config(**changes))
    return caught.value.problems


def verl(**paths: object) -> dict[str, str]:
    """`verl=...` for config(): verl paths given with `__` for `.` (data__train_batch_size=128)."""
    return {"verl": verl_value({k.replace("__", "."): v for k, v in paths.items()})}


def only_problem(**changes: str) -> str:
    found = problems(**changes)
    assert len(found) == 1, found
    return found[0]


def test_base_config_is_valid_with_the_tutorials_defaults():
    cfg = load_config(config())
    assert (cfg.platform, cfg.cluster_mode, cfg.gpu_nodes, cfg.gpu_max_nodes) == ("a4", "standard", 2, 10)
    assert cfg.bucket_name == ""  # derived from the stack: domain.names
    assert cfg.cluster_location == "us-central1"
    assert cfg.rdma_subnet_cidrs == tuple(f"192.168.{i}.0/24" for i in range(1, 9))
    get = cfg.verl.get
    assert get("data.train_batch_size") == 256 and get(A + "ppo_mini_batch_size") == 256
    # The execution profile: rollout TP chosen for a 32B model on 179 GiB B200s, no padding, dynamic batches.
    assert get("actor_rollout_ref.rollout.tensor_model_parallel_size") == 4
    assert (get("actor_rollout_ref.model.use_remove_padding"), get(A + "use_dynamic_bsz")) == (True, True)
    assert get("actor_rollout_ref.model.path") == "/data/Qwen2.5-32B-Instruct"


def test_a4x_defaults_are_the_tutorials_a4x_job():
    cfg = load_config(config(platform="a4x", gpuNodes="4", gpuMaxNodes="4"))
    get = cfg.verl.get
    assert (get(A + "ppo_mini_batch_size"), get(A + "ppo_micro_batch_size_per_gpu")) == (64, 8)
    assert (get("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
            get("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu")) == (16, 16)
    assert (get("actor_rollout_ref.rollout.tensor_model_parallel_size"), get(A + "use_kl_loss")) == (4, True)
    assert cfg.rdma_nics == 0 and cfg.rdma_subnet_cidrs == ()
    assert cfg.verl_image == "verlai/verl:vllm023.aarch64.dev1"


def test_all_problems_are_reported_at_once():
    found = problems(platform="a4x", gpuNodes="4", clusterMode="autopilot", gcp__zone="europe-west4-a",
                     **verl(data__train_batch_size=255, actor_rollout_ref__rollout__n=4))
    assert len(found) == 3
    assert any(p.startswith('verl-gke:clusterMode = "autopilot": A4X') for p in found)
    assert any(p.startswith('gcp:zone = "europe-west4-a"') for p in found)
    assert any(p.startswith("verl-gke:verl.data.train_batch_size = 255") for p in found)


def test_message_names_the_file_and_count():
    with pytest.raises(ConfigError) as caught:
        load_config(config(platform="h100"), "Pulumi.x.yaml")
    assert str(caught.value).startswith("Pulumi.x.yaml has 1 problem:\n  verl-gke:platform = \"h100\": must be one of")


@pytest.mark.parametrize("key, value, fragment", [
    ("platform", "h100", "must be one of 'a4', 'a3u', 'a4x' or 'g2'"),
    ("gpuNodes", "two", "must be a whole number"),
    ("gpuSpot", "maybe", "must be true or false"),
    ("clusterMode", "serverless", "must be one of 'autopilot' or 'standard'"),
])
def test_malformed_values_name_key_and_value(key: str, value: str, fragment: str):
    message = only_problem(**{key: value})
    assert message.startswith(f'verl-gke:{key} = "{value}": ')
    assert fragment in message


@pytest.mark.parametrize("key", ["colour", "grpoColour", "hftoken"])
def test_an_unknown_key_is_named_without_its_value_which_may_be_a_secret(key: str):
    assert only_problem(**{key: "hf_abcdefgh1234"}) == (
        f"verl-gke:{key}: unknown key; see Pulumi.yaml for the keys verl-gke reads")


def test_every_problem_is_reported_in_one_pass():
    found = problems(gcp__zone="", gpuNodes="two", bucketName="UPPER")
    assert [line.split(" ", 1)[0] for line in found] == ["gcp:zone", "verl-gke:gpuNodes", "verl-gke:bucketName"]
    assert found[0] == "gcp:zone is not set: run `pulumi config set gcp:zone <value>`"


def test_keys_without_a_namespace_or_with_an_unknown_one_are_errors_not_ignored():
    raw = {**config(), "gpuNodes": "4", "verlgke:gpuNodes": "4", "kubernetes:context": "x"}
    with pytest.raises(ConfigError) as caught:
        load_config(raw)
    assert caught.value.problems == [
        "gpuNodes: a config key needs its namespace; write verl-gke:gpuNodes",
        "verlgke:gpuNodes: unknown namespace 'verlgke'; verl-gke reads verl-gke:<key> and gcp:project, "
        "gcp:region, gcp:zone",
    ]


def test_gcp_keys_verl_gke_does_not_read_are_a_warning():
    from domain.config import config_warnings

    raw = {**config(), "gcp:credentials": "/k.json"}
    load_config(raw)
    assert config_warnings(raw) == ["gcp:credentials is not read by verl-gke; Pulumi passes it on to the gcp provider"]


def test_secret_values_never_appear_in_problems():
    raw = {**config(), "verl-gke:bucketName": "Secret-Bucket-Name"}
    with pytest.raises(ConfigError) as caught:
        load_config(raw, secret_keys=["verl-gke:bucketName"])
    assert "Secret-Bucket-Name" not in str(caught.value)
    assert 'verl-gke:bucketName = "[secret]": a GCS bucket name' in str(caught.value)


def test_missing_project_says_how_to_set_it():
    raw = config()
    del raw["gcp:project"]
    with pytest.raises(ConfigError) as caught:
        load_config(raw)
    assert caught.value.problems == ["gcp:project is not set: run `pulumi config set gcp:project <value>`"]


@pytest.mark.parametrize("zone, ok", [("us-central1-b", True), ("us-east1-b", False), ("us-central1", False)])
def test_zone_must_be_in_region(zone: str, ok: bool):
    if ok:
        assert load_config(config(gcp__zone=zone)).zone == zone
    else:
        assert "must be a zone of region us-central1" in only_problem(gcp__zone=zone)


@pytest.mark.parametrize("project, ok", [("my-project-123", True), ("My_Project", False), ("abc", False)])
def test_project_id_format(project: str, ok: bool):
    if ok:
        load_config(config(gcp__project=project))
    else:
        assert "a GCP project id" in only_problem(gcp__project=project, bucketName="fixed-bucket")


def test_a4x_only_on_standard():
    load_config(config(platform="a4x", gpuNodes="4"))
    assert "runs only on Standard clusters" in only_problem(platform="a4x", gpuNodes="4", clusterMode="autopilot")


def test_autopilot_uses_the_ray_addon():
    load_config(config(clusterMode="autopilot"))
    assert "use \"addon\"" in only_problem(clusterMode="autopilot", rayOperator="helm")


def test_gpu_nodes_not_above_max():
    load_config(config(gpuNodes="4", gpuMaxNodes="4"))
    assert only_problem(gpuNodes="4", gpuMaxNodes="3") == "verl-gke:gpuNodes = 4: must be <= gpuMaxNodes (3)."


def test_a4x_pool_fits_one_nvl72_rack():
    assert load_config(config(platform="a4x", gpuNodes="4", gpuMaxNodes="18")).gpu_max_nodes == 18
    assert only_problem(platform="a4x", gpuNodes="4", gpuMaxNodes="19") == (
        "verl-gke:gpuMaxNodes = 19: A4X (4x NVIDIA GB200, arm64) nodes share one 1x72 NVLink domain: at most 18.")
    load_config(config(gpuMaxNodes="40"))  # no placement limit on A4


def test_cpu_min_not_above_max():
    load_config(config(cpuMinNodes="0", cpuMaxNodes="1"))
    assert only_problem(cpuMinNodes="6", cpuMaxNodes="5") == "verl-gke:cpuMinNodes = 6: must be <= cpuMaxNodes (5)."


def test_standard_needs_a_reservation_but_autopilot_and_existing_clusters_do_not():
    load_config(config(reservation="", clusterMode="autopilot"))
    load_config(config(reservation="", existingCluster="true"))
    assert "consume a reservation" in only_problem(reservation="")


@pytest.mark.parametrize("name", ["my-reservation", "projects/other-proj-1/reservations/my-reservation",
                                  "my-reservation/reservationBlocks/block-1",
                                  "projects/other-proj-1/reservations/my-reservation/reservationBlocks/block-1"])
def test_a_reservation_is_named_in_a_form_gke_takes(name: str):
    assert load_config(config(reservation=name)).reservation == name


@pytest.mark.parametrize("name", ["projects/other-proj/reservations", "projects/other-proj/reservations/",
                                  "My_Reservation", "zones/us-central1-b/reservations/r", "r/blocks/b",
                                  "projects/x/reservations/r"])
def test_a_malformed_reservation_name_is_refused_with_the_expected_form(name: str):
    assert only_problem(reservation=name) == (
        f'verl-gke:reservation = "{name}": the reservation\'s name (my-reservation), a block of it '
        "(my-reservation/reservationBlocks/<block>), or a shared one as projects/<owner project>/reservations/"
        "<name>[/reservationBlocks/<block>]: names of 1-63 lowercase letters, digits or hyphens, starting with a "
        "letter.")


def test_spot_pools_take_no_reservation():
    load_config(config(reservation="", gpuSpot="true"))
    assert only_problem(gpuSpot="true") == (
        'verl-gke:reservation = "my-reservation": Spot VMs cannot consume a reservation; leave it empty with gpuSpot.')


@pytest.mark.parametrize("name, ok", [("verl-gke", True), ("Verl", False), ("-x", False), ("a" * 41, False)])
def test_cluster_name_rules(name: str, ok: bool):
    if ok:
        load_config(config(clusterName=name))
    else:
        assert only_problem(clusterName=name).startswith(f'verl-gke:clusterName = "{name}"')


@pytest.mark.parametrize("bucket, ok", [
    ("my-bucket_1.data", True), ("My-Bucket", False), ("ab", False), ("goog-bucket", False),
    ("my-google-bucket", False), ("-bucket", False), ("192.168.5.4", False), ("a" * 64, False),
    (".".join(["a" * 63, "b" * 63, "c" * 63]), True), ("a" * 64 + ".b", False), ("a..b", False),
    ("my-g00gle-bucket", False), ("data.example.com", True)])
def test_bucket_name_rules(bucket: str, ok: bool):
    if ok:
        assert load_config(config(bucketName=bucket)).bucket_name == bucket
    else:
        assert "a GCS bucket name" in only_problem(bucketName=bucket)


@pytest.mark.parametrize("namespace, ok", [("ml-team", True), ("ML", False), ("a" * 64, False), ("a.b", False)])
def test_namespace_rules(namespace: str, ok: bool):
    if ok:
        load_config(config(namespace=namespace))
    else:
        assert "a Kubernetes namespace" in only_problem(namespace=namespace)


def test_service_account_and_ray_cluster_names():
    load_config(config(serviceAccount="ray.sa", rayClusterName="my-ray"))
    assert "a Kubernetes name" in only_problem(serviceAccount="Ray_SA")
    assert "at most 47" in only_problem(rayClusterName="a" * 48)


def test_network_prefixes_leave_room_for_suffixes():
    load_config(config(rdmaNetworkPrefix="r" * 57))
    assert "at most 57 characters" in only_problem(rdmaNetworkPrefix="r" * 58)
    assert "starting with a letter" in only_problem(gvnicNetworkPrefix="1net")


def test_overlapping_cidrs_are_rejected():
    assert problems(gvnicSubnetCidr="192.168.0.0/22") == [
        f'verl-gke:rdmaSubnetCidrs = "192.168.{i}.0/24": overlaps 192.168.0.0/22 (verl-gke:gvnicSubnetCidr).'
        for i in (1, 2, 3)]


def test_overlapping_rdma_cidrs_each_reported():
    cidrs = '["10.9.0.0/24","10.9.0.0/24","10.9.2.0/24","10.9.3.0/24","10.9.4.0/24","10.9.5.0/24","10.9.6.0/24","10.9.7.0/24"]'
    assert only_problem(rdmaSubnetCidrs=cidrs) == \
        'verl-gke:rdmaSubnetCidrs = "10.9.0.0/24": overlaps 10.9.0.0/24 (verl-gke:rdmaSubnetCidrs).'


def test_cidr_syntax_and_count():
    assert "an IPv4 CIDR" in only_problem(gvnicSubnetCidr="192.168.0.0/33")
    assert "needs exactly 8 RDMA subnets" in only_problem(rdmaSubnetCidrs='["10.1.0.0/24"]')
    custom = '["10.1.0.0/24","10.1.1.0/24","10.1.2.0/24","10.1.3.0/24"]'
    assert load_config(config(platform="a4x", gpuNodes="4", a4xNetworking="multi-network",
                              rdmaSubnetCidrs=custom)).rdma_nics == 4


def test_requests_must_fit_the_machine():
    assert load_config(config(platform="a3u")).worker_memory_gi == 2552  # not the tutorial's 2800Gi
    load_config(config(workerCpus="200", workerMemoryGi="2000"))
    assert only_problem(workerCpus="224") == ('verl-gke:workerCpus = 224: each a4-highgpu-8g node has 223.37 '
                                              'allocatable vCPUs; request at most 222 (default 219).')
    assert "request at most 2686 (default 2552)" in only_problem(platform="a3u", workerMemoryGi="2800")


def test_a4x_workers_leave_room_for_the_head():
    a4x = {"platform": "a4x", "gpuNodes": "4"}
    cfg = load_config(config(**a4x))
    assert (cfg.worker_cpus, cfg.worker_memory_gi) == (123, 726)
    load_config(config(**a4x, workerCpus="126", workerMemoryGi="766"))
    assert "request at most 126 beside the Ray head (default 123)" in only_problem(**a4x, workerCpus="127")
    assert "request at most 766 beside the Ray head (default 726)" in only_problem(**a4x, workerMemoryGi="767")
    assert "/dev/shm" in only_problem(workerMemoryGi="200")


def test_a4x_needs_kubernetes_134():
    load_config(config(platform="a4x", gpuNodes="4", kubernetesVersion="1.34.1-gke.1829001"))
    load_config(config(platform="a4x", gpuNodes="4", kubernetesVersion="1.35"))
    load_config(config(platform="a4x", gpuNodes="4", kubernetesVersion="1.34"))
    load_config(config(platform="a4x", gpuNodes="4"))  # empty: the channel picks, at preview, above the floors
    assert ("A4X (4x NVIDIA GB200, arm64) (DRA resource.k8s.io/v1) needs 1.34 or newer"
            in only_problem(platform="a4x", gpuNodes="4", kubernetesVersion="1.33"))
    assert "DRANET needs 1.34.1-gke.1829001" in only_problem(platform="a4x", gpuNodes="4",
                                                             kubernetesVersion="1.34.1-gke.1800000")
    load_config(config(platform="a4x", gpuNodes="4", kubernetesVersion="1.34.0", a4xNetworking="multi-network"))
    assert "DRANET needs" in only_problem(platform="a4x", gpuNodes="4", kubernetesVersion="1.34.0")
    assert "a GKE version" in only_problem(kubernetesVersion="latest")


def test_revisions_and_images_are_pinned():
    assert "40-hex commit" in only_problem(modelRevision="main")
    assert "40-hex commit" in only_problem(datasetRevision="v1")
    assert "fixed tag" in only_problem(verlImage="verlai/verl:latest")
    assert "fixed tag" in only_problem(verlImage="verlai/verl")
    load_config(config(verlImage="verlai/verl@sha256:" + "a" * 64))
    load_config(config(verlImage="registry.example:5000/verl:vllm011.dev7@sha256:" + "b" * 64))
    assert "fixed tag" in only_problem(verlImage="registry.example:5000/verl")


@pytest.mark.parametrize("image", ["registry.example:5000/verl:vllm011.dev7", "me/verl:1.0"])
def test_an_image_of_ones_own_must_be_pinned_by_digest(image: str):
    assert only_problem(verlImage=image) == (
        f'verl-gke:verlImage = "{image}": an image of your own must be pinned by digest (name@sha256:<64 hex>): '
        "a tag can be moved to other code that then runs on every node.")
    assert load_config(config(verlImage="verlai/verl:vllm011.dev7")).verl_image == "verlai/verl:vllm011.dev7"


def test_urls_and_quantities():
    assert "a manifest of Google's installers at a commit" in only_problem(ncclInstallerUrl="http://example.com/x.yaml")
    assert "an https URL" in only_problem(jobDashboardUrl="ray-head:8265")
    load_config(config(jobDashboardUrl="https://10.200.0.5:8265", rayDashboardCidrs='["10.200.0.5/32"]',
                       volumeCapacity="1Ti"))
    assert "a Kubernetes quantity" in only_problem(volumeCapacity="768GB")


COMMIT = "07a8e6c9b2208ee865a1fb9b9b246e10adfd7738"
RAW = "https://raw.githubusercontent.com/GoogleCloudPlatform/container-engine-accelerators"


@pytest.mark.parametrize("url, ok", [
    (f"{RAW}/{COMMIT}/gpudirect-rdma/nccl-rdma-installer.yaml", True),
    (f"{RAW}/master/gpudirect-rdma/nccl-rdma-installer.yaml", False),
    (f"{RAW}/07a8e6c/gpudirect-rdma/nccl-rdma-installer.yaml", False),
    (f"{RAW}/{COMMIT.upper()}/gpudirect-rdma/x.yaml", False),
    (f"{RAW}/{COMMIT}/x.yaml?token=abc", False),
    (f"https://{COMMIT}/x.yaml", False),
    # Any host with a 40-hex path segment is not Google's repository.
    (f"https://evil.example/{COMMIT}/gpudirect-rdma/nccl-rdma-installer.yaml", False),
    (f"https://raw.githubusercontent.com/attacker/container-engine-accelerators/{COMMIT}/gpudirect-rdma/x.yaml", False),
    (f"https://evil.example/GoogleCloudPlatform/container-engine-accelerators/{COMMIT}/gpudirect-rdma/x.yaml", False),
    (f"{RAW}/{COMMIT}/gpudirect-tcpx/x.yaml", False),
    (f"{RAW}/{COMMIT}/gpudirect-rdma/sub/x.yaml", False),
])
def test_nccl_installer_url_must_be_googles_installer_at_a_commit(url: str, ok: bool):
    if ok:
        assert load_config(config(ncclInstallerUrl=url)).nccl_installer_url == url
    else:
        assert only_problem(ncclInstallerUrl=url).endswith(
            f": a manifest of Google's installers at a commit: {RAW}/<40-hex commit>/gpudirect-rdma/<file>.yaml "
            "(no branch, tag, other host or repository, query or fragment).")


@pytest.mark.parametrize("url, shown", [
    ("https://admin:hunter2@10.0.0.5:8265", "https://***@10.0.0.5:8265"),
    ("https://10.0.0.5:8265/?token=hunter2", "https://10.0.0.5:8265/?***"),
    ("https://10.0.0.5:8265/#hunter2", "https://10.0.0.5:8265/#***"),
])
def test_credentials_in_the_dashboard_url_are_refused_and_never_printed(url: str, shown: str):
    line = only_problem(jobDashboardUrl=url)
    assert line.startswith(f'verl-gke:jobDashboardUrl = "{shown}": no credentials in the URL')
    assert "hunter2" not in line


def test_master_authorized_cidrs_must_be_cidrs():
    cfg = load_config(config(masterAuthorizedCidrs='["10.8.0.0/16", "192.168.0.0/16"]'))
    assert cfg.master_authorized_cidrs == ("10.8.0.0/16", "192.168.0.0/16")  # may overlap the VPCs
    assert only_problem(masterAuthorizedCidrs='["10.0.0.0/33"]') == (
        'verl-gke:masterAuthorizedCidrs = "10.0.0.0/33": an IPv4 CIDR such as 192.168.1.0/24.')


PRIVATE = ("a private range (inside 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 or 100.64.0.0/10): this key admits "
           "traffic, never from the internet.")


@pytest.mark.parametrize("key, value, shown", [
    ("masterAuthorizedCidrs", '["0.0.0.0/0"]', "0.0.0.0/0"),
    ("masterAuthorizedCidrs", '["203.0.113.0/24"]', "203.0.113.0/24"),
    ("rayDashboardCidrs", '["0.0.0.0/0"]', "0.0.0.0/0"),
    ("rayDashboardCidrs", '["8.8.8.0/24"]', "8.8.8.0/24"),
    ("rayDashboardCidrs", '["10.0.0.0/7"]', "10.0.0.0/7"),
    ("gvnicSubnetCidr", "100.0.0.0/24", "100.0.0.0/24"),  # the gVNIC firewall's source
])
def test_cidrs_that_admit_traffic_must_be_private(key: str, value: str, shown: str):
    assert f'verl-gke:{key} = "{shown}": {PRIVATE}' in problems(**{key: value})


def test_private_and_shared_ranges_are_admitted():
    cfg = load_config(config(rayDashboardCidrs='["100.64.0.0/16", "172.16.4.0/24"]', **TOKEN_AUTH_IMAGE,
                             gvnicSubnetCidr="10.1.0.0/24",
                             rdmaSubnetCidrs=json_list(f"10.2.{i}.0/24" for i in range(8))))
    assert cfg.ray_dashboard_cidrs == ("100.64.0.0/16", "172.16.4.0/24")


@pytest.mark.parametrize("cidr, why", [
    ("10.0.0.0/8", "overlaps 10.0.0.0/20 (verl-gke:nodeSubnetCidr): it would admit the cluster's own nodes or pods, "
                   "of every namespace, to the Ray Job API."),
    ("10.6.0.0/16", "overlaps 10.4.0.0/14 (verl-gke:podCidr): it would admit the cluster's own nodes or pods, "
                    "of every namespace, to the Ray Job API."),
    ("10.0.32.0/24", "overlaps 10.0.32.0/20 (verl-gke:serviceCidr): it would admit the cluster's own nodes or pods, "
                     "of every namespace, to the Ray Job API."),
    ("172.16.0.0/12", "at most 65536 addresses (a /16 or narrower): the callers of the Job API are a VPN's or a "
                      "bastion's range, not a whole private address space."),
])
def test_dashboard_cidrs_admit_neither_the_clusters_own_ranges_nor_a_whole_address_space(cidr: str, why: str):
    assert f'verl-gke:rayDashboardCidrs = "{cidr}": {why}' in problems(rayDashboardCidrs=f'["{cidr}"]',
                                                                      **TOKEN_AUTH_IMAGE)


TOKEN_AUTH_IMAGE = {"verlImage": "example.com/me/verl@sha256:" + "0" * 64, "rayVersion": "2.52.0"}


def test_without_ray_token_auth_the_job_api_is_open_to_single_hosts_only_and_never_over_http():
    """Why 3: Ray 2.47/2.49 run any job submitted to 8265 (CVE-2023-48022): a range admits every host
    in it; a single host is the authenticated front (a bastion's proxy). http carries jobs in clear."""
    assert problems(rayDashboardCidrs='["10.200.0.0/24", "10.201.0.7/32"]') == [
        'verl-gke:rayDashboardCidrs = "10.200.0.0/24": a single host (/32) behind an authenticated front: Ray 2.47.0 '
        "of this stack's image has no token authentication, so any host of the range could run jobs "
        "(CVE-2023-48022); or an image with Ray >= 2.52 (verlImage, rayVersion)."]
    assert load_config(config(rayDashboardCidrs='["10.200.0.0/24"]', **TOKEN_AUTH_IMAGE)).ray_dashboard_cidrs == (
        "10.200.0.0/24",)
    assert only_problem(jobDashboardUrl="http://10.200.0.5:8265", rayDashboardCidrs='["10.200.0.5/32"]') == (
        'verl-gke:jobDashboardUrl = "http://10.200.0.5:8265": an https URL of a privately reachable Ray dashboard '
        "behind a TLS front (plain http carries the jobs, and with token authentication the token, in clear).")
    assert only_problem(jobDashboardUrl="https://10.0.0.5:8265", rayNetworkPolicy="false") == (
        'verl-gke:jobDashboardUrl = "https://10.0.0.5:8265": with Ray 2.47.0 (no token authentication) only with '
        "rayNetworkPolicy on and rayDashboardCidrs single hosts behind an authenticated front; or an image with "
        "Ray >= 2.52 (verlImage, rayVersion).")
    load_config(config(jobDashboardUrl="https://10.0.0.5:8265", rayNetworkPolicy="false", **TOKEN_AUTH_IMAGE))


def test_job_attempt_is_a_whole_number_from_zero():
    assert load_config(config(jobAttempt="2")).job_attempt == 2
    assert only_problem(jobAttempt="-1") == "verl-gke:jobAttempt = -1: must be at least 0."


@pytest.mark.parametrize("key", ["trainer.default_local_dir", "actor_rollout_ref.model.path", "data.train_files",
                                 "data.val_files"])
@pytest.mark.parametrize("path", ["/data/../etc", "/data/./x", "/data//x", "/data/x/", "data/x", "/tmp/x", "/data"])
def test_run_paths_stay_plainly_under_the_bucket_mount(key: str, path: str):
    assert only_problem(verl=verl_value({key: path})).startswith(
        f'verl-gke:verl.{key} = "{path}": an absolute path under the bucket mount')


@pytest.mark.parametrize("model", ["Qwen/../etc", "Qwen/Qwen 2.5 32B", "Qwen2.5-32B-Instruct", "Qwen/a--b",
                                   "Qwen/x.git", "-Qwen/x", "a/" + "b" * 97])
def test_model_and_dataset_are_hub_repo_ids_as_the_staging_job_requires(model: str):
    from workloads import stage_data

    assert only_problem(model=model, **verl(actor_rollout_ref__model__path="/data/m")).startswith(
        f'verl-gke:model = "{model}": a Hugging Face repo id')
    assert only_problem(dataset=model).startswith(f'verl-gke:dataset = "{model}": a Hugging Face repo id')
    with pytest.raises(stage_data.StagingError, match="is not a Hub repo id"):
        stage_data.parse_args([f"--model-repo={model}", "--model-dir", "m"])


def test_good_repo_ids_pass_both_checks():
    from workloads import stage_data

    for repo in ("Qwen/Qwen2.5-32B-Instruct", "openai/gsm8k", "my-org/model_v1.5"):
        assert stage_data.is_repo_id(repo)
    load_config(config(model="my-org/model_v1.5", modelRevision="1" * 40))


def test_the_x86_image_on_a4x_and_the_arm_image_on_a4_are_rejected():
    x86 = "verlai/verl:vllm011.dev7"
    arm = "verlai/verl:vllm023.aarch64.dev1"
    assert only_problem(platform="a4x", gpuNodes="4", verlImage=x86) == (
        f'verl-gke:verlImage = "{x86}": is built for amd64 only; A4X (4x NVIDIA GB200, arm64) nodes are arm64: '
        f"use {arm} or an image built for arm64.")
    assert "is built for arm64 only" in only_problem(verlImage=arm)
    load_config(config(platform="a4x", gpuNodes="4", verlImage="me/verl-arm@sha256:" + "c" * 64))


def test_checkpoint_dir_on_the_bucket():
    assert load_config(config(**verl(trainer__default_local_dir="/data/runs/ckpt"))).verl.get(
        "trainer.default_local_dir") == "/data/runs/ckpt"
    assert "under the bucket mount /data/" in only_problem(**verl(trainer__default_local_dir="/tmp/ckpt"))


# verl's rules: 2 nodes x 8 GPUs = 16 GPUs unless said otherwise.
def test_batch_times_n_divisible_by_gpus():
    valid = {"actor_rollout_ref__rollout__n": 5, "actor_rollout_ref__actor__ppo_mini_batch_size": 128}
    load_config(config(**verl(data__train_batch_size=256, **valid)))
    assert only_problem(**verl(data__train_batch_size=250, **valid)) == (
        "verl-gke:verl.data.train_batch_size = 250: data.train_batch_size x actor_rollout_ref.rollout.n (1250) must "
        "be divisible by the 16 GPUs (2 nodes x 8).")


def test_mini_batch_not_above_train_batch():
    load_config(config(**verl(actor_rollout_ref__actor__ppo_mini_batch_size=128)))
    assert "must be <= data.train_batch_size (256)" in only_problem(
        **verl(actor_rollout_ref__actor__ppo_mini_batch_size=512))


def test_rollout_tp_divides_gpus_per_node():
    load_config(config(**verl(actor_rollout_ref__rollout__tensor_model_parallel_size=4)))
    assert "must divide the 16 GPUs" in only_problem(**verl(actor_rollout_ref__rollout__tensor_model_parallel_size=3))
    assert "GPUs per node" in only_problem(gpuNodes="4", **verl(actor_rollout_ref__rollout__tensor_model_parallel_size=16))


def test_mini_batch_times_n_divisible_by_data_parallel():
    assert "data-parallel size (16)" in only_problem(**verl(actor_rollout_ref__actor__ppo_mini_batch_size=3))


def test_micro_batch_divides_per_gpu_mini_batch():
    assert "per-GPU mini batch (128" in only_problem(**verl(actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu=48))


def test_ulysses_needs_remove_padding():
    on = {"actor_rollout_ref__actor__ulysses_sequence_parallel_size": 2}
    load_config(config(**verl(**on)))
    assert "needs actor_rollout_ref.model.use_remove_padding" in only_problem(
        **verl(**on, actor_rollout_ref__model__use_remove_padding=False))


def test_placeholders_listed():
    raw = config(gcp__project="replace-me-project", reservation="replace-me-reservation")
    assert placeholders(raw, load_config(raw)) == ["gcp:project", "verl-gke:reservation"]
    assert placeholders(config(), load_config(config())) == []


@pytest.mark.parametrize("unused", [{"clusterMode": "autopilot"}, {"existingCluster": "true"}])
def test_a_reservation_placeholder_the_stack_never_reads_blocks_nothing(unused: dict[str, str]):
    raw = config(reservation="replace-me-reservation", **unused)
    assert placeholders(raw, load_config(raw)) == []


def test_upgrade_exclusion_start_is_utc_rfc3339_empty_or_none():
    assert load_config(config(upgradeExclusionStart="")).upgrade_exclusion_start == ""
    assert only_problem(upgradeExclusionStart="2026-12-01 00:00") == (
        'verl-gke:upgradeExclusionStart = "2026-12-01 00:00": an RFC3339 UTC time such as 2027-03-01T00:00:00Z, '
        "empty (from the cluster's first `pulumi up`) or none (no exclusion).")


def test_the_cluster_subnets_ranges_may_not_overlap_the_gpu_subnets():
    assert only_problem(podCidr="192.168.0.0/24") == (
        'verl-gke:gvnicSubnetCidr = "192.168.0.0/24": overlaps 192.168.0.0/24 (verl-gke:podCidr).')
    assert "an IPv4 CIDR" in only_problem(serviceCidr="10.0.32.0/33")


# --- accepted here, refused later on GCP or on the nodes (issue: a new user's inputs) -----------

@pytest.mark.parametrize("location", ["us-central1", "us-central1-b"])
def test_the_cluster_location_is_the_region_or_one_of_its_zones(location: str):
    assert load_config(config(clusterLocation=location)).cluster_location == location


@pytest.mark.parametrize("location", ["europe-west4", "europe-west4-a", "garbage"])
def test_a_cluster_location_outside_the_region_is_refused(location: str):
    assert only_problem(clusterLocation=location) == (
        f'verl-gke:clusterLocation = "{location}": the region us-central1 (gcp:region) or one of its zones such as '
        'us-central1-b: the subnets, NAT and GPU nodes are there.')


def test_another_model_with_the_default_models_commit_is_refused():
    from workloads.stage_data import DEFAULT_DATASET_REVISION, DEFAULT_MODEL_REVISION

    assert only_problem(model="Qwen/Qwen2.5-7B-Instruct") == (
        f'verl-gke:modelRevision = "{DEFAULT_MODEL_REVISION}": is the commit of the default model '
        'Qwen/Qwen2.5-32B-Instruct; set the commit of Qwen/Qwen2.5-7B-Instruct to stage.')
    assert "is the commit of the default dataset" in only_problem(dataset="openai/gsm8k-copy")
    other = "0" * 40
    assert load_config(config(model="Qwen/Qwen2.5-7B-Instruct", modelRevision=other)).model_revision == other
    assert DEFAULT_DATASET_REVISION  # the default pair stays valid (test_base_config_is_valid...)


def test_verl_in_image_with_an_image_without_verl_is_refused():
    assert only_problem(verlInImage="true") == (
        'verl-gke:verlInImage = true: verlai/verl:vllm011.dev7 ships verl\'s dependencies without verl; '
        'set verlImage to an image you built with verl, or leave verlInImage false (staging installs it).')
    assert load_config(config(verlInImage="true", verlImage="example.com/me/verl@sha256:" + "0" * 64)).verl_in_image


def test_a_dashboard_url_the_stacks_network_policy_blocks_is_refused():
    assert only_problem(jobDashboardUrl="https://10.0.0.5:8265") == (
        'verl-gke:jobDashboardUrl = "https://10.0.0.5:8265": the stack\'s NetworkPolicy admits only the Ray pods '
        'to port 8265; add the caller\'s range to rayDashboardCidrs, or set rayNetworkPolicy to false.')
    load_config(config(jobDashboardUrl="https://10.200.0.5:8265", rayDashboardCidrs='["10.200.0.5/32"]'))


def test_internal_source_range_is_no_longer_read_the_gvnic_firewall_admits_its_subnet():
    assert only_problem(internalSourceRange="192.168.0.0/16") == (
        "verl-gke:internalSourceRange: no longer read: the gVNIC firewall admits gvnicSubnetCidr only; "
        "`pulumi config rm verl-gke:internalSourceRange`.")


@pytest.mark.parametrize("start", ["2026-02-30T00:00:00Z", "2026-13-01T00:00:00Z", "2026-12-01T24:00:00Z"])
def test_an_exclusion_start_that_is_no_date_is_refused(start: str):
    assert "an RFC3339 UTC time" in only_problem(upgradeExclusionStart=start)


@pytest.mark.parametrize("image", ["verlai/verl@sha256:abc", "VerlAI/verl:1.0", "verlai/verl:", "verlai//verl:1",
                                   "verlai/verl:-bad", "verlai/verl:" + "x" * 129])
def test_an_image_outside_the_oci_reference_grammar_is_refused(image: str):
    assert "an image reference" in only_problem(verlImage=image)


@pytest.mark.parametrize("image", ["verlai/verl:vllm011.dev7", "us-docker.pkg.dev/p/r/verl:1.0",
                                   "localhost:5000/verl:1", "verlai/verl@sha256:" + "a" * 64,
                                   "verlai/verl:1.0@sha256:" + "0" * 64])
def test_images_inside_the_grammar_pass(image: str):
    """Inside the grammar; an image of one's own must still be pinned by digest (its own rule)."""
    if "@sha256:" in image or image.startswith("verlai/verl:vllm"):
        assert load_config(config(verlImage=image)).verl_image == image
    else:
        assert "an image of your own must be pinned by digest" in only_problem(verlImage=image)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999"])
def test_a_number_that_is_not_finite_is_refused(value: str):
    line = only_problem(**verl(actor_rollout_ref__actor__optim__lr=value))
    assert line == f'verl-gke:verl.actor_rollout_ref.actor.optim.lr = "{value}": must be a number (verl 0.6.1\'s default: 1e-06).'


@pytest.mark.parametrize(("key", "limit"), [("stagingTimeoutMinutes", 153722867), ("jobReadyTimeoutSeconds", 9223372036),
                                            ("runBudgetHours", 2562047)])
def test_durations_beyond_what_the_engine_accepts_are_refused(key: str, limit: int):
    load_config(config(**{key: str(limit)}))
    assert only_problem(**{key: str(limit + 1)}) == (
        f"verl-gke:{key} = {limit + 1}: at most {limit}: the Pulumi engine's longest duration (about 292 years).")


@pytest.mark.parametrize("name", ["1ray", "-ray", "ray-"])
def test_a_ray_cluster_name_must_start_with_a_letter(name: str):
    assert only_problem(rayClusterName=name) == (
        f'verl-gke:rayClusterName = "{name}": at most 47 lowercase letters, digits or hyphens, starting with a letter '
        'and ending with a letter or digit (KubeRay wants a DNS-1035 label).')


def test_an_image_name_longer_than_registries_take_is_refused():
    name = "verlai/" + "v" * 248  # 255 characters without the tag
    digest = "@sha256:" + "0" * 64
    assert load_config(config(verlImage=f"{name}{digest}")).verl_image == f"{name}{digest}"
    assert "an image reference" in only_problem(verlImage=f"{name}v{digest}")


def test_the_cluster_network_is_empty_or_a_vpc_name():
    assert load_config(config(clusterNetwork="default")).cluster_network == "default"
    assert "the name of an existing VPC" in only_problem(clusterNetwork="Default Net")


# --- Pulumi's declared types, our words ---------------------------------------------------------

@pytest.mark.parametrize(("key", "value", "message"), [
    # pulumi/pulumi sdk/go/common/workspace/project.go ValidateConfigValue: a boolean is the text
    # "true" or "false" (or a YAML boolean), an integer what strconv.Atoi reads.
    ("runSupervisor", "yes", "must be true or false (Pulumi's boolean type: `pulumi up` refuses any other spelling)."),
    ("runSupervisor", "True", "must be true or false (Pulumi's boolean type: `pulumi up` refuses any other spelling)."),
    ("gpuNodes", "4.5", "must be a whole number such as 4 or 5 (Pulumi's integer type has no fractions)."),
    ("gpuNodes", "1_000", "must be a whole number such as 2 (Pulumi's integer type)."),
    ("gpuNodes", "0x10", "must be a whole number such as 2 (Pulumi's integer type)."),
    ("gpuNodes", " 4", "must be a whole number such as 2 (Pulumi's integer type)."),
    ("gpuNodes", "9223372036854775808", "must be a whole number such as 2 (Pulumi's integer type)."),
    ("capacity", "spot", 'must be a list such as ["a", "b"] (Pulumi\'s array type: a YAML list in the stack file).'),
    ("capacity", '["spot", 1]', "must be a list of strings (Pulumi's array<string> type)."),
])
def test_values_are_read_with_the_types_the_pulumi_cli_enforces(key: str, value: str, message: str):
    assert only_problem(**{key: value}) == f"verl-gke:{key} = {json.dumps(value)}: {message}"


def test_what_the_pulumi_cli_takes_is_taken():
    cfg = load_config(config(gpuNodes="+4", gpuMaxNodes="010", runSupervisor="false", capacity='["reservation"]'))
    assert (cfg.gpu_nodes, cfg.gpu_max_nodes, cfg.run_supervisor, cfg.capacity) == (4, 10, False, ("reservation",))


def test_an_unknown_key_names_the_nearest_known_one():
    assert only_problem(gpuNode="4") == (
        "verl-gke:gpuNode: unknown key; did you mean verl-gke:gpuNodes? (Pulumi.yaml lists every key verl-gke reads)")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("gpuNodes", "0", "must be at least 1."),
    ("cpuMinNodes", "-1", "must be at least 0."),
])
def test_bounds_are_said_in_our_words(key: str, value: str, message: str):
    assert only_problem(**{key: value}) == f"verl-gke:{key} = {value}: {message}"


def test_a_bad_region_suggests_no_zone_made_from_it():
    assert problems(gcp__region="us-central") == [
        'gcp:region = "us-central": a GCP region such as us-central1 (the region of gcp:zone us-central1-b).']
    assert problems(gcp__region="us-central", gcp__zone="b") == ['gcp:region = "us-central": a GCP region such as '
                                                                'us-central1.', 'gcp:zone = "b": a GCP zone such as '
                                                                'us-central1-b.']


def test_a_misspelt_cpu_machine_type_names_the_nearest_one():
    assert only_problem(cpuMachineType="c2-standrad-16") == (
        'verl-gke:cpuMachineType = "c2-standrad-16": did you mean c2-standard-16? A Compute Engine machine type '
        "<series>-<type>-<vCPUs> of an x86 series: c2 (standard), c2d, c3, c3d, c4, e2, n1, n2, n2d, n4 (standard, "
        "highcpu, highmem); c3, c3d and c4 also with -lssd.")


@pytest.mark.parametrize("machine", ["c2-standard-16", "n2-highmem-32", "c3-standard-22-lssd", "e2-standard-8"])
def test_cpu_machine_types_of_the_x86_series_are_taken(machine: str):
    assert load_config(config(cpuMachineType=machine)).cpu_machine_type == machine


def test_a_dataset_staging_would_refuse_is_refused_at_synth():
    from workloads.stage_data import dataset_problem

    found = only_problem(dataset="hendrycks/competition_math", datasetRevision="a" * 40)
    assert found == f'verl-gke:dataset = "hendrycks/competition_math": {dataset_problem("hendrycks/competition_math")}'
    assert dataset_problem("hendrycks/competition_math") == (
        "staging preprocesses only openai/gsm8k (or a copy whose name contains gsm8k, main/train-* and main/test-* "
        "parquet shards of question and answer) and DigitalLearningGmbH/MATH-lighteval (or a copy whose name "
        "contains math-lighteval, data/train-* and data/test-* parquet shards of problem and solution) as verl's "
        "examples/data_preprocess does; for other data, verl-gke:dataDir.")
    assert dataset_problem("openai/gsm8k") is None and dataset_problem("me/gsm8k-clean") is None
    assert dataset_problem("DigitalLearningGmbH/MATH-lighteval") is None


MATH = "DigitalLearningGmbH/MATH-lighteval"


def test_math_is_staged_at_its_pinned_commit_into_its_own_folder():
    cfg = load_config(config(dataset=MATH, **verl(data__filter_overlong_prompts=True)))
    assert cfg.dataset_revision == "0530c78699ea5e8eb5530600900e1f328b48acad"
    assert (cfg.verl.get("data.train_files"), cfg.verl.get("data.val_files")) == (
        "/data/math/train.parquet", "/data/math/test.parquet")


def test_math_with_prompts_verl_would_stop_on_is_refused():
    assert only_problem(dataset=MATH) == (
        'verl-gke:verl.data.filter_overlong_prompts = false: with data.truncation "error" verl stops the run on the '
        f"first {MATH} prompt longer than data.max_prompt_length (512), after the GPUs are up, and their lengths "
        "need the model's tokenizer and the rows, which synth does not read: set it to true, as verl's MATH "
        'examples do, or data.truncation to "left" or "right".')
    load_config(config(dataset=MATH, **verl(data__truncation="right")))


def test_a_copy_of_a_pinned_dataset_names_its_own_commit():
    assert only_problem(dataset="me/math-lighteval-clean", datasetRevision="0530c78699ea5e8eb5530600900e1f328b48acad",
                        **verl(data__filter_overlong_prompts=True)) == (
        'verl-gke:datasetRevision = "0530c78699ea5e8eb5530600900e1f328b48acad": is the commit of the default '
        f"dataset {MATH}; set the commit of me/math-lighteval-clean to stage.")


def test_a_dataset_and_data_of_your_own_are_not_both_taken(tmp_path):
    from tests.test_user_data import row, write

    folder = write(tmp_path / "mine", [row()])
    assert only_problem(dataset=MATH, dataDir=str(folder), **verl(data__filter_overlong_prompts=True)) == (
        f'verl-gke:dataDir = "{folder}": the run trains on it, not on verl-gke:dataset {MATH}: set one of them.')


def test_a_value_larger_than_a_command_line_argument_is_refused():
    huge = json.dumps({"trainer": {"experiment_name": "y" * 140_000}})
    assert only_problem(verl=huge) == (
        f"verl-gke:verl: {len(huge):,} bytes; at most 131,072 (Linux's MAX_ARG_STRLEN: the run's "
        "command line is one argument of `sh -c`).")


def test_a_fabric_floor_above_the_line_rate_is_refused():
    assert only_problem(fabricMinBusBandwidthGbps="500") == (
        "verl-gke:fabricMinBusBandwidthGbps = 500: above the 400 GB/s an A4 (8x NVIDIA B200) node's fabric carries "
        "(8 x 400 Gb/s RoCE NICs), so no fabric passes: at most 400 (0: the platform's 200).")


@pytest.mark.parametrize("key", ["runMaxRetries", "runMaxPreemptions"])
def test_retries_beyond_reason_are_refused(key: str):
    assert only_problem(**{key: "1000"}) == (
        f"verl-gke:{key} = 1000: at most 100: a run that needs more attempts fails for a reason another attempt "
        "cannot fix, and each one restarts from the last checkpoint on GPUs that are paid for.")


@pytest.mark.parametrize("path", ["/data/verl-0.6.1", "/data/verl-0.6.1/ckpt", "/data/gsm8k/ckpt",
                                  "/data/Qwen2.5-32B-Instruct/checkpoints"])
def test_checkpoints_never_go_where_staging_puts_code_the_model_or_data(path: str):
    """The checkpoint dir is a prefix the Ray pods may write (domain.bucket): inside a staged folder it
    would let a job rewrite what every later pod runs."""
    assert only_problem(verl=verl_value({"trainer.default_local_dir": path})) == (
        f'verl-gke:verl.trainer.default_local_dir = "{path}": outside what staging writes (/data/Qwen2.5-32B-Instruct, '
        "/data/gsm8k, /data/verl-0.6.1): the Ray pods may write the checkpoint dir, never the model, the data or "
        "the code they run.")


@pytest.mark.parametrize("key, path", [("actor_rollout_ref.model.path", "/data/models/r/model"),
                                       ("data.train_files", "/data/verl/checkpoints/train.parquet"),
                                       ("data.val_files", "/data/huggingface_cache/test.parquet")])
def test_the_model_and_data_a_run_reads_are_not_where_ray_pods_write(key: str, path: str):
    assert only_problem(verl=verl_value({key: path})) == (
        f'verl-gke:verl.{key} = "{path}": outside the folders the Ray pods may write (verl/checkpoints/, models/, '
        "huggingface_cache/): a job could replace what the next run loads.")


def test_the_staging_service_account_name_fits_beside_the_given_one():
    assert "a Kubernetes name" in only_problem(serviceAccount="a" * 246)
    load_config(config(serviceAccount="a" * 245))


def test_the_ray_version_is_the_images():
    assert load_config(config()).image_ray_version == "2.47.0"
    assert load_config(config(platform="a4x", gpuNodes="4")).image_ray_version == "2.49.0"
    own = "me/verl@sha256:" + "a" * 64
    assert load_config(config(verlImage=own, rayVersion="2.54.0")).image_ray_version == "2.54.0"
    assert only_problem(rayVersion="2.54") == (
        'verl-gke:rayVersion = "2.54": the Ray version inside verlImage, X.Y.Z such as 2.54.0.')
    assert only_problem(rayVersion="2.54.0") == (
        'verl-gke:rayVersion = "2.54.0": verlai/verl:vllm011.dev7 has Ray 2.47.0: leave rayVersion unset, or set it '
        "with an image of your own.")


def test_chart_digests_take_name_version_keys_and_sha256_digests_only():
    good = "sha256:" + "cd" * 32
    cfg = load_config(config(chartDigests=json.dumps({"kuberay-operator:1.6.2": good})))
    assert cfg.chart_digests == {"kuberay-operator:1.6.2": good}
    assert problems(chartDigests=json.dumps({"kuberay-operator:1.6.2": "cd" * 32,
                                             "kuberay-operator-1.6.2.tgz": good})) == [
        f'verl-gke:chartDigests = {{"kuberay-operator:1.6.2": "{"cd" * 32}"}}: keys are charts as name:version (e.g. '
        "kuberay-operator:1.6.2), values the sha256:<64 lowercase hex> of its archive, as `python -m "
        "verl_gke.image_pins --stack <stack>` prints it.",
        f'verl-gke:chartDigests = {{"kuberay-operator-1.6.2.tgz": "{good}"}}: keys are charts as name:version (e.g. '
        "kuberay-operator:1.6.2), values the sha256:<64 lowercase hex> of its archive, as `python -m "
        "verl_gke.image_pins --stack <stack>` prints it.",
    ]


def test_image_digests_take_tagged_images_and_sha256_digests_only():
    good = "sha256:" + "ab" * 32
    cfg = load_config(config(imageDigests=json.dumps({"verlai/verl:vllm011.dev7": good})))
    assert cfg.image_digests == {"verlai/verl:vllm011.dev7": good}
    assert problems(imageDigests=json.dumps({"verlai/verl:vllm011.dev7": "sha256:abc",
                                             f"verlai/verl@{good}": good})) == [
        'verl-gke:imageDigests = {"verlai/verl:vllm011.dev7": "sha256:abc"}: each digest is sha256:<64 lowercase '
        "hex> (the registry's manifest digest, as `python -m verl_gke.image_pins --stack <stack>` prints it).",
        f'verl-gke:imageDigests = {{"verlai/verl@{good}": "{good}"}}: keys are tagged images as the stack names them '
        "(name:tag, e.g. verlai/verl:vllm011.dev7), values their sha256:<64 hex> digest.",
    ]


def test_the_model_holds_its_rules_beside_its_fields():
    """Validating StackConfig alone refuses what load_config refuses: a field's rule is its type, a rule over
    several fields a model validator (load_config only gathers every problem into one message)."""
    from pydantic import ValidationError

    from domain.config import StackConfig, _as_field_values

    with pytest.raises(ValidationError) as caught:
        StackConfig.model_validate(_as_field_values(config(bucketName="goog-bucket", gpuNodes="two")))
    assert [(e["loc"], e["type"]) for e in caught.value.errors()] == [(("gpuNodes",), "config"),
                                                                      (("bucketName",), "config")]
    with pytest.raises(ValidationError, match=r"verl-gke:gpuNodes = 4: must be <= gpuMaxNodes \(3\)\."):
        StackConfig.model_validate(_as_field_values(config(gpuNodes="4", gpuMaxNodes="3")))


def test_a_dataset_the_stacks_verl_does_not_score_is_refused(monkeypatch):
    from domain import user_data

    # A verl release whose default_compute_score table lacks MATH (0.6.1's and 0.9.0's hold it).
    monkeypatch.setattr(user_data, "known_sources", lambda release: (frozenset({"openai/gsm8k"}), ()))
    assert only_problem(dataset=MATH, **verl(data__filter_overlong_prompts=True)) == (
        f'verl-gke:dataset = "{MATH}": verl 0.6.1\'s default reward does not score {MATH}; set '
        "verl-gke:rewardFunction.")
