"""Against a real kube-apiserver (v1.20 with etcd; ../shared/k8s): the capacity
source, growing the RayCluster, the deployment manifests and the RBAC rules.

There is no kubelet or scheduler: the tests bind pods and set their phase as
those would. Namespaces cannot be deleted here, so every test uses a new one.
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from elasticps.k8s import KubeCapacity, KubeRay, KubeRayGrowth
from elasticps.sched import ClusterView, NodeView, PolicyState, Resources, make_policy
from tests.builders import make_job

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kubernetes"
CRD = Path(__file__).parent / "data" / "raycluster-crd.yaml"


def _tools() -> Path | None:
    for candidate in (os.environ.get("ELASTICPS_K8S_TOOLS"), ROOT.parent / "shared" / "k8s", "/work/shared/k8s"):
        if candidate and (Path(candidate) / "start").exists():
            return Path(candidate)
    return None


@pytest.fixture(scope="session")
def stopping():
    """Commands still stopping what a module started, waited for at the end of the
    session: the API server takes ~10 s to stop, and the modules after this one need not wait."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        proc.wait(timeout=120)


@pytest.fixture(scope="module")
def kube(stopping):
    tools = _tools()
    home = Path(os.environ.get("K8S_HOME", Path.home() / ".cache" / "elasticps-k8s"))
    if tools is None or not (home / "bin" / "kube-apiserver").exists():
        if os.environ.get("ELASTICPS_REQUIRE_K8S"):
            pytest.fail("no kube-apiserver: run ../shared/k8s/build-kube-apiserver (make test does)")
        pytest.skip("no kube-apiserver built (make test builds it)")
    from kubernetes import config

    subprocess.run([str(tools / "stop")], capture_output=True, check=False)
    kubeconfig = subprocess.run([str(tools / "start")], capture_output=True, text=True, check=True).stdout.strip()
    try:
        yield config.new_client_from_config(config_file=kubeconfig), kubeconfig
    finally:
        stopping.append(subprocess.Popen([str(tools / "stop")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def _ns(api) -> str:
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


def _wait(cond, timeout_s: float = 10.0, what: str = "condition") -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def _node(api, name: str, cpu: str, memory: str = "64Gi", unschedulable: bool = False) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_node({"metadata": {"name": name}, "spec": {"unschedulable": unschedulable}})
    status = {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}, "capacity": {"cpu": cpu, "memory": memory}}
    status["conditions"] = [{"type": "Ready", "status": "True"}]
    core.patch_node_status(name, {"status": status})


def _pod(api, ns: str, name: str, node: str | None, cpu: str, labels: dict | None = None) -> None:
    """Create a pod and, playing the scheduler and the kubelet, bind it and mark it Running."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    container = {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}
    meta = {"name": name, "labels": labels or {}}
    core.create_namespaced_pod(ns, {"metadata": meta, "spec": {"containers": [container]}})
    if node is not None:
        binding = {"metadata": {"name": name}, "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        core.create_namespaced_pod_binding(name, ns, binding, _preload_content=False)
        core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running"}})


def _docs(path: Path, ns: str) -> list[dict]:
    """The manifests with their namespace (and service-account subjects) moved to ``ns``."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for d in docs:
        if "namespace" in d["metadata"]:
            d["metadata"]["namespace"] = ns
        for s in d.get("subjects") or []:
            s["namespace"] = ns
    return docs


def _install_crd(api) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext = client.ApiextensionsV1Api(api)
    try:
        ext.create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
    except ApiException as exc:
        if exc.status != 409:
            raise

    def established() -> bool:
        conds = ext.read_custom_resource_definition("rayclusters.ray.io").status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    _wait(established, what="CRD established")


def _create(api, doc: dict, ns: str, dry_run: str | None = None) -> None:
    from kubernetes import client, utils

    kw = {"dry_run": dry_run} if dry_run else {}
    if doc["apiVersion"].startswith("ray.io/"):
        client.CustomObjectsApi(api).create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", doc, **kw)
    else:
        utils.create_from_dict(api, doc, namespace=ns, **kw)


# -- manifests -------------------------------------------------------------------------


def test_manifests_are_valid_against_the_kubernetes_schemas(kube):
    import kubernetes_validate

    api, _ = kube
    _install_crd(api)
    ns = _ns(api)
    kinds = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for doc in _docs(path, ns):
            kinds.append(doc["kind"])
            if not doc["apiVersion"].startswith("ray.io/"):  # offline: the built-in kinds' published schemas
                kubernetes_validate.validate(doc, "1.30.0", strict=True)
            _create(api, doc, ns, dry_run="All")  # the real API server validates every object, the RayCluster too
    rbac = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    assert sorted(kinds) == sorted([*rbac, "PersistentVolumeClaim", "RayCluster", "Service"])
    bad = copy.deepcopy(next(d for d in _docs(DEPLOY / "raycluster.yaml", ns) if d["kind"] == "RayCluster"))
    bad["spec"]["workerGroupSpecs"][0]["replicas"] = -1
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as err:
        _create(api, bad, ns, dry_run="All")
    assert err.value.status == 422 and "replicas" in err.value.body


# -- capacity ----------------------------------------------------------------------------


def test_the_capacity_source_follows_nodes_and_pods_of_every_tenant(kube):
    from kubernetes import client

    api, _ = kube
    core = client.CoreV1Api(api)
    ns, tag = _ns(api), uuid.uuid4().hex[:6]
    n1, n2 = f"{tag}-n1", f"{tag}-n2"
    _node(api, n1, "8")
    changes: list[float] = []
    cap = KubeCapacity(api, ours={"ray.io/cluster": "rc"}, on_change=lambda: changes.append(time.monotonic()))
    cap.start()
    try:
        cap.wait_synced()

        def cpu_free(node: str) -> float | None:
            return next((n.available.cpu for n in cap.view().nodes if n.name == node), None)

        assert cpu_free(n1) == 8.0
        _node(api, n2, "16")
        took = [_wait(lambda: cpu_free(n2) == 16.0, what="a new node")]
        _pod(api, ns, "tenant-a", n1, "3")
        took.append(_wait(lambda: cpu_free(n1) == 5.0, what="another tenant's pod counted"))
        _pod(api, ns, "pending", None, "2")  # not scheduled: holds nothing
        _pod(api, ns, "ray-worker", n1, "2", labels={"ray.io/cluster": "rc"})  # ours: the manager sees it in Ray
        _wait(lambda: cap.free().get(n1, Resources()).cpu == 3.0, what="our pod counted as used, not as others'")
        assert cpu_free(n1) == 5.0
        core.patch_namespaced_pod_status("tenant-a", ns, {"status": {"phase": "Succeeded"}})
        took.append(_wait(lambda: cpu_free(n1) == 8.0, what="a finished pod released"))
        _pod(api, ns, "tenant-b", n2, "10")
        _wait(lambda: cpu_free(n2) == 6.0, what="second tenant pod")
        core.delete_namespaced_pod("tenant-b", ns, grace_period_seconds=0)
        took.append(_wait(lambda: cpu_free(n2) == 16.0, what="a deleted pod released"))
        core.patch_node(n2, {"spec": {"unschedulable": True}})
        took.append(_wait(lambda: cpu_free(n2) is None, what="a cordoned node dropped"))
        core.delete_node(n2)
        core.delete_node(n1)
        took.append(_wait(lambda: cpu_free(n1) is None, what="a deleted node dropped"))
        assert changes, "no change was signalled"
        print(f"capacity changes seen after {[round(t, 3) for t in took]} s")
        assert max(took) < 5.0, took
    finally:
        cap.stop()


# -- growing the Ray cluster -------------------------------------------------------------


def _raycluster(api, ns: str) -> KubeRay:
    _install_crd(api)
    for doc in _docs(DEPLOY / "raycluster.yaml", ns):
        if doc["kind"] == "RayCluster":
            _create(api, doc, ns)
    return KubeRay(api, ns, "elasticps")


def test_growth_raises_the_worker_group_when_jobs_need_room_and_lowers_it_when_pods_idle(kube):
    api, _ = kube
    ns, tag = _ns(api), uuid.uuid4().hex[:6]
    kuberay = _raycluster(api, ns)
    _, group, _ = kuberay.worker_group()
    assert (group.replicas, group.min_replicas, group.max_replicas, group.pod.cpu) == (1, 0, 16, 4.0)
    # Kubernetes: three 16-CPU nodes; another tenant uses 14 CPUs of the first; our one worker pod runs there
    for i in range(3):
        _node(api, f"{tag}-k{i}", "16")
    _pod(api, ns, "tenant", f"{tag}-k0", "14")
    _pod(api, ns, "elasticps-workers-a", f"{tag}-k1", "4", {"ray.io/cluster": "elasticps", "ray.io/group": "workers"})
    cap = KubeCapacity(api, ours={"ray.io/cluster": "elasticps"}).start()
    now = [0.0]
    growth = KubeRayGrowth(cap, kuberay, idle_grace_s=60, clock=lambda: now[0])
    try:
        cap.wait_synced()
        _wait(lambda: len(cap.pods({"ray.io/group": "workers"}, ns)) == 1, what="worker pod seen")
        ray = ClusterView((NodeView("ray-node-a", Resources(cpu=4)),))
        hostnames = {"ray-node-a": "elasticps-workers-a"}
        # a job that can use 1 PS + 11 workers: 12 CPUs, 8 more than the one 4-CPU pod has
        job = make_job("big", min_ps=1, max_ps=1, min_workers=1, max_workers=11)
        policy = make_policy("greedy")
        plan = growth.reconcile(policy, [job], ray, PolicyState(), {}, hostnames)
        assert plan is not None and plan.replicas == 3, plan
        assert kuberay.worker_group()[1].replicas == 3
        # the new pods are asked for but not in Ray yet: asking again changes nothing
        assert growth.reconcile(policy, [job], ray, PolicyState(), {}, hostnames) is None
        # the job is gone: the two pods not yet started are dropped at once ...
        assert growth.reconcile(policy, [], ray, PolicyState(), {}, hostnames).replicas == 1
        # ... and the running one once it has been idle past the grace period, by name
        now[0] += 61
        plan = growth.reconcile(policy, [], ray, PolicyState(), {}, hostnames)
        assert plan is not None and (plan.replicas, plan.workers_to_delete) == (0, ("elasticps-workers-a",))
        obj = kuberay.read()["spec"]["workerGroupSpecs"][0]
        assert obj["replicas"] == 0 and obj["scaleStrategy"]["workersToDelete"] == ["elasticps-workers-a"]
    finally:
        cap.stop()


def test_idle_worker_pods_are_named_in_workers_to_delete(kube):
    from kubernetes import client

    api, _ = kube
    ns, tag = _ns(api), uuid.uuid4().hex[:6]
    kuberay = _raycluster(api, ns)
    two = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}]
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "ray.io", "v1", ns, "rayclusters", "elasticps", two, _content_type="application/json-patch+json"
    )
    _node(api, f"{tag}-k0", "16")
    labels = {"ray.io/cluster": "elasticps", "ray.io/group": "workers"}
    for pod in ("elasticps-workers-a", "elasticps-workers-b"):
        _pod(api, ns, pod, f"{tag}-k0", "4", labels)
    cap = KubeCapacity(api, ours={"ray.io/cluster": "elasticps"}).start()
    now = [0.0]
    growth = KubeRayGrowth(cap, kuberay, idle_grace_s=60, clock=lambda: now[0])
    try:
        cap.wait_synced()
        _wait(lambda: len(cap.pods(labels, ns)) == 2, what="worker pods seen")
        ray = ClusterView((NodeView("ra", Resources(cpu=4)), NodeView("rb", Resources(cpu=4))))
        hostnames = {"ra": "elasticps-workers-a", "rb": "elasticps-workers-b"}
        job = make_job("small", min_ps=1, max_ps=1, min_workers=1, max_workers=1)
        ours = {"ra": Resources(cpu=2)}  # the job runs on pod a; pod b holds nothing
        policy = make_policy("greedy")
        current = {"small": {"ps-0": "ra", "worker-0": "ra"}}
        assert growth.reconcile(policy, [job], ray, PolicyState(), ours, hostnames, current) is None  # not idle long
        now[0] += 61
        plan = growth.reconcile(policy, [job], ray, PolicyState(), ours, hostnames, current)
        assert plan is not None and (plan.replicas, plan.workers_to_delete) == (1, ("elasticps-workers-b",))
        spec = kuberay.read()["spec"]["workerGroupSpecs"][0]
        assert spec["replicas"] == 1 and spec["scaleStrategy"]["workersToDelete"] == ["elasticps-workers-b"]
    finally:
        cap.stop()


# -- RBAC --------------------------------------------------------------------------------


def _service_account_client(api, kubeconfig: str, ns: str):
    """A client authenticated as the manager's service account (a real token from the TokenRequest API)."""
    from kubernetes import client

    req = {"spec": {"audiences": ["https://kubernetes.default.svc.cluster.local"], "expirationSeconds": 3600}}
    token = client.CoreV1Api(api).create_namespaced_service_account_token("elasticps-manager", ns, req).status.token
    kc = yaml.safe_load(Path(kubeconfig).read_text())
    cfg = client.Configuration()
    cfg.host = kc["clusters"][0]["cluster"]["server"]
    cfg.ssl_ca_cert = kc["clusters"][0]["cluster"]["certificate-authority"]
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def test_the_managers_service_account_can_do_what_it_needs_and_nothing_else(kube):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api, kubeconfig = kube
    ns, tag = _ns(api), uuid.uuid4().hex[:6]
    for doc in _docs(DEPLOY / "rbac.yaml", ns):
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):  # cluster-scoped: one per test namespace
            doc["metadata"]["name"] += f"-{ns}"
            if doc["kind"] == "ClusterRoleBinding":
                doc["roleRef"]["name"] += f"-{ns}"
        _create(api, doc, ns)
    kuberay = _raycluster(api, ns)
    other = next(d for d in _docs(DEPLOY / "raycluster.yaml", ns) if d["kind"] == "RayCluster")
    other["metadata"]["name"] = "someone-else"
    _create(api, other, ns)
    _node(api, f"{tag}-k0", "8")
    sa = _service_account_client(api, kubeconfig, ns)

    # allowed: watch capacity, read and resize its own RayCluster
    cap = KubeCapacity(sa, ours={"ray.io/cluster": "elasticps"}).start()
    try:
        cap.wait_synced()
        assert any(n.name == f"{tag}-k0" for n in cap.view().nodes)
    finally:
        cap.stop()
    mine = KubeRay(sa, ns, "elasticps")
    index, group, _ = mine.worker_group()
    from elasticps.k8s import ReplicaPlan

    mine.apply(index, group.name, ReplicaPlan(4))
    assert kuberay.worker_group()[1].replicas == 4

    # refused: everything else
    core, custom = client.CoreV1Api(sa), client.CustomObjectsApi(sa)
    pod = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    refused = {
        "create a pod": lambda: core.create_namespaced_pod(ns, pod),
        "delete a node": lambda: core.delete_node(f"{tag}-k0"),
        "patch a node": lambda: core.patch_node(f"{tag}-k0", {"spec": {"unschedulable": True}}),
        "read secrets": lambda: core.list_namespaced_secret(ns),
        "read another RayCluster": lambda: custom.get_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", "someone-else"
        ),
        "patch another RayCluster": lambda: KubeRay(sa, ns, "someone-else").apply(0, "workers", ReplicaPlan(9)),
        "delete its RayCluster": lambda: custom.delete_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", "elasticps"
        ),
        "create a RayCluster": lambda: custom.create_namespaced_custom_object(
            "ray.io", "v1", ns, "rayclusters", {**other, "metadata": {"name": "new", "namespace": ns}}
        ),
    }
    for what, call in refused.items():
        with pytest.raises(ApiException) as err:
            call()
        assert err.value.status == 403, what


# -- the manager, wired to KubeRay ---------------------------------------------------------


def test_the_manager_asks_kuberay_for_the_pods_its_jobs_would_use(kube, ray_local, tmp_path):
    import ray

    from elasticps.manager import Store
    from elasticps.manager.service import Manager
    from elasticps.manager.spec import JobSpec

    api, _ = kube
    ns, tag = _ns(api), uuid.uuid4().hex[:6]
    kuberay = _raycluster(api, ns)  # replicas 1, 4-CPU pods, max 16
    _node(api, f"{tag}-k0", "64")
    # the local Ray node (8 CPUs) plays the RayCluster's one worker pod: a pod named like its host
    host = next(n["NodeManagerHostname"] for n in ray.nodes() if n["Alive"])
    _pod(api, ns, host, f"{tag}-k0", "4", {"ray.io/cluster": "elasticps", "ray.io/group": "workers"})
    cap = KubeCapacity(api, ours={"ray.io/cluster": "elasticps"}).start()
    manager = Manager(Store(tmp_path / "m.db"), tmp_path, policy="greedy", growth=KubeRayGrowth(cap, kuberay))
    try:
        cap.wait_synced()
        _wait(lambda: len(cap.pods({"ray.io/cluster": "elasticps"}, ns)) == 1, what="worker pod seen")
        spec = JobSpec.model_validate(
            {
                "name": "big",
                "program": "elasticps.examples.digits:program",
                "ps": {"min": 1, "max": 1, "cpu": 1},
                "workers": {"min": 1, "max": 15, "cpu": 1},
            }
        )
        manager.submit(spec)
        for p, w in ((1, 1), (1, 2), (1, 4)):  # a speed model fitted on earlier runs: it scales with workers
            manager.store.record_observation("big", 0.0, p, w, 1000.0 * w / (1 + 0.05 * w))
        decision = manager.step()
        assert decision["big"] == (1, 7)  # what fits in the 8 CPUs Ray has now
        # 16 tasks wanted: 8 more CPUs than Ray has = two more 4-CPU pods
        assert kuberay.worker_group()[1].replicas == 3
        growth = [m for _, _, _, kind, m in manager.store.events() if kind == "growth"]
        assert growth and growth[-1].startswith("Ray worker pods -> 3"), growth
        # the RayCluster gone for three rounds: said once, in one line, and its return once
        from kubernetes import client

        client.CustomObjectsApi(api).delete_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", "elasticps")
        for _ in range(3):
            manager.step()
        _raycluster(api, ns)
        manager.step()
        later = [m for _, _, _, kind, m in manager.store.events() if kind == "growth"][len(growth) :]
        assert later[0] == 'could not resize the Ray cluster: 404 Not Found: rayclusters.ray.io "elasticps" not found'
        assert later[1] == "the Ray cluster can be resized again", later
        assert all(m.startswith("Ray worker pods -> 3") for m in later[2:]), later  # the new one grown as the old
    finally:
        manager.shutdown()
        cap.stop()


def test_server_wiring_reads_the_raycluster_and_names_a_missing_one(kube):
    from elasticps.errors import ConfigError
    from elasticps.k8s.deploy import kuberay_growth

    api, kubeconfig = kube
    ns = _ns(api)
    _raycluster(api, ns)
    _node(api, f"{uuid.uuid4().hex[:6]}-k0", "8")
    woken: list[bool] = []
    growth, cap = kuberay_growth("elasticps", ns, None, kubeconfig, on_change=lambda: woken.append(True))
    try:
        assert growth.kuberay.worker_group()[1].name == "workers"
        assert woken  # the first listing (a node) counts as a change
    finally:
        cap.stop()
    with pytest.raises(ConfigError, match=f"cannot read RayCluster {ns}/nope: 404"):
        kuberay_growth("nope", ns, None, kubeconfig)
