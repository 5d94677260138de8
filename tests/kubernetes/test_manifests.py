"""deploy/kubernetes/ against the Kubernetes API schemas, and against itself.

Run by tests/tests/manifests.rs (which passes the device plugin's binary in
NPUD_DEVICE_PLUGIN_BIN); needs `python3 -m pip install kubernetes-validate pytest`.

- Every manifest validates, in strict mode (no unknown fields), against the schemas
  kubernetes-validate ships for the oldest and the newest Kubernetes it knows of that we
  claim; a manifest broken on purpose (a wrong type, an unknown field, a missing required
  field) is rejected.
- Cross-references: the plugin (its own --print-config, from the DaemonSet's command line)
  mounts into pods the host directory that holds the socket npud.toml names; the plugin
  reaches npud's socket and the kubelet's directory through the DaemonSet's mounts; the
  token directory is the same host directory for npud (`auth.token_dir`) and the plugin;
  the resource the example Pod requests is the plugin's; the ports and the probes follow
  npud.toml; the Services select the DaemonSet's pods and name its ports.
"""

import copy
import json
import os
import pathlib
import subprocess
import tomllib

import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
EXAMPLE = DEPLOY / "example" / "npu-demo-pod.yaml"
# The Kubernetes releases the manifests are written for (DaemonSet, Services and Pod fields
# that have been stable since before the first), checked at both ends.
VERSIONS = ["1.30.0", "1.37.0"]
NODE_LABEL = ("amd.com/npu.present", "true")


def load(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization():
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def objects():
    out = []
    for name in kustomization()["resources"]:
        out.extend(load(DEPLOY / name))
    return out


def by_kind(kind, name=None):
    found = [o for o in objects() if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"one {kind} {name or ''} in deploy/kubernetes, found {len(found)}"
    return found[0]


def container(pod_spec, name):
    (c,) = [c for c in pod_spec["containers"] if c["name"] == name]
    return c


def volume_of(pod_spec, c, mount_path):
    """The volume a container mounts at mount_path."""
    (m,) = [m for m in c.get("volumeMounts", []) if m["mountPath"] == mount_path]
    (v,) = [v for v in pod_spec["volumes"] if v["name"] == m["name"]]
    return v, m


def host_path_mounted_at(pod_spec, c, path):
    """The host path behind `path` in container c: the longest mount containing it."""
    path = pathlib.PurePosixPath(path)
    best = None
    for m in c.get("volumeMounts", []):
        mp = pathlib.PurePosixPath(m["mountPath"])
        if path == mp or mp in path.parents:
            if best is None or len(mp.parts) > len(pathlib.PurePosixPath(best["mountPath"]).parts):
                best = m
    assert best is not None, f"{c['name']} mounts nothing at {path}"
    (v,) = [v for v in pod_spec["volumes"] if v["name"] == best["name"]]
    assert "hostPath" in v, f"{c['name']}: {path} is on volume {v['name']}, not a host path"
    rest = path.relative_to(best["mountPath"])
    return str(pathlib.PurePosixPath(v["hostPath"]["path"]) / rest), best


def npud_toml():
    return tomllib.loads(by_kind("ConfigMap", "npud-config")["data"]["npud.toml"])


def port_of(listen):
    return int(listen.rsplit(":", 1)[1])


def plugin_config(ds):
    """The device plugin's resolved configuration for the DaemonSet's command line."""
    binary = os.environ.get("NPUD_DEVICE_PLUGIN_BIN")
    assert binary, "NPUD_DEVICE_PLUGIN_BIN names the npud-device-plugin binary"
    c = container(ds["spec"]["template"]["spec"], "device-plugin")
    argv = list(c.get("command", [])) + list(c.get("args", []))
    assert argv[0] == "npud-device-plugin", argv
    env = {k: v for k, v in os.environ.items() if not k.startswith("NPUD_PLUGIN_")}
    env.update({e["name"]: e["value"] for e in c.get("env", [])})
    out = subprocess.run([binary, *argv[1:], "--print-config"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# --- schemas -----------------------------------------------------------------------------


def every_manifest():
    docs = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for i, d in enumerate(load(path)):
            docs.append(pytest.param(d, id=f"{path.relative_to(DEPLOY)}#{i}"))
    return docs


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("doc", every_manifest())
def test_each_manifest_matches_the_api_schema(doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_the_kustomization_lists_every_manifest_but_the_example():
    listed = set(kustomization()["resources"])
    present = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present
    for o in objects():
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == "npud-system", o["metadata"]


def rejected(doc, words):
    with pytest.raises(kubernetes_validate.utils.ValidationError) as e:
        kubernetes_validate.validate(doc, VERSIONS[-1], strict=True)
    assert words in str(e.value.message), e.value.message


def test_a_broken_manifest_is_rejected():
    ds = by_kind("DaemonSet")
    kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)
    # A port number as a string.
    bad = copy.deepcopy(ds)
    container(bad["spec"]["template"]["spec"], "npud")["ports"][0]["containerPort"] = "50051"
    rejected(bad, "is not of type 'integer'")
    # A misspelt field: strict schemas allow no unknown fields.
    bad = copy.deepcopy(ds)
    bad["spec"]["template"]["spec"]["nodeSelectr"] = {"a": "b"}
    rejected(bad, "'nodeSelectr' was unexpected")
    # A DaemonSet without its selector.
    bad = copy.deepcopy(ds)
    del bad["spec"]["selector"]
    rejected(bad, "'selector' is a required property")
    # A port without its number.
    bad = copy.deepcopy(ds)
    del container(bad["spec"]["template"]["spec"], "npud")["ports"][0]["containerPort"]
    rejected(bad, "'containerPort' is a required property")


# --- cross-references ----------------------------------------------------------------------


def test_the_plugin_mounts_the_host_directory_of_npuds_socket():
    ds = by_kind("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    toml = npud_toml()
    plugin = plugin_config(ds)
    npud = container(spec, "npud")
    dp = container(spec, "device-plugin")
    socket = pathlib.PurePosixPath(toml["socket"])
    # npud's socket on the host, as npud creates it.
    host_socket, _ = host_path_mounted_at(spec, npud, socket)
    assert str(pathlib.PurePosixPath(host_socket).parent) == plugin["host_socket_dir"]
    # fd_socket sits beside it, in the directory pods get.
    assert pathlib.PurePosixPath(toml["fd_socket"]).parent == socket.parent
    # The plugin watches the same socket through its own mount.
    assert host_path_mounted_at(spec, dp, plugin["npud_socket"])[0] == host_socket
    # Inside pods, NPUD_ADDR names the socket in the mounted directory, at the path npud has
    # it: npud tells clients its fd socket's path as it sees it (OpenSession's fd_socket), so
    # pods must see the directory where npud does.
    assert plugin["container_socket_dir"] == str(socket.parent)
    assert plugin["container_npud_addr"] == f"unix:{socket}"
    # The kubelet's directory.
    kubelet_host, _ = host_path_mounted_at(spec, dp, plugin["kubelet_socket"])
    assert kubelet_host == "/var/lib/kubelet/device-plugins/kubelet.sock"
    assert plugin["plugin_socket"].startswith("/var/lib/kubelet/device-plugins/")


def test_the_token_directory_is_one_host_directory():
    ds = by_kind("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    plugin = plugin_config(ds)
    token_dir = npud_toml()["auth"]["token_dir"]
    npud_host, m = host_path_mounted_at(spec, container(spec, "npud"), token_dir)
    assert m.get("readOnly") is True, "npud only reads tokens"
    plugin_host, m = host_path_mounted_at(spec, container(spec, "device-plugin"), plugin["token_dir"])
    assert not m.get("readOnly"), "the plugin writes tokens"
    assert npud_host == plugin_host == plugin["host_token_dir"]
    # The init container gives the directory to npud's uid with no access for others, which
    # npud and the plugin both require; the plugin checks it against npud's uid.
    init = " ".join(spec["initContainers"][0]["command"])
    uid = container(spec, "npud")["securityContext"]["runAsUser"]
    assert f"-m 0700 -o {uid} -g {uid} {token_dir}" in init, init
    assert f"chmod 0700 {token_dir}" in init, init
    assert plugin["token_dir_uid"] == uid


def test_tokens_are_required_on_the_unix_socket_and_no_pod_uid_is_an_admin():
    auth = npud_toml()["auth"]
    # A pod without its token gets GetDeviceInfo and health only.
    assert "unix" in auth["require_token"]
    # Admins are token identities no pod can hold (the plugin names its files npu<N>-share-...),
    # never a uid a pod could run as (the default admins include uid:0).
    assert auth["admins"], "the defaults name uid:0"
    for a in auth["admins"]:
        assert a.startswith("token:") and not a.startswith("token:npu"), a


def test_the_example_pod_requests_the_plugins_resource_and_can_use_the_socket():
    ds = by_kind("DaemonSet")
    plugin = plugin_config(ds)
    (pod,) = load(EXAMPLE)
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"] == {plugin["resource_name"]: 1}
    # npud's socket is 0660 for npud's group: the pod is a member.
    npud = container(ds["spec"]["template"]["spec"], "npud")
    assert npud["securityContext"]["runAsGroup"] in pod["spec"]["securityContext"]["supplementalGroups"]
    # The pod asks for no host path and no privilege: the plugin's Allocate brings the socket.
    assert all("hostPath" not in v for v in pod["spec"].get("volumes", []))
    assert not c["securityContext"].get("privileged", False)
    # The token the pod gets, and its environment, follow the contract.
    assert plugin["token_mount_path"] == "/var/run/secrets/npud/token"
    assert plugin["container_npud_addr"] == "unix:/run/npud/npud.sock"


def test_ports_probes_and_scrape_annotations_follow_npud_toml():
    ds = by_kind("DaemonSet")
    template = ds["spec"]["template"]
    npud = container(template["spec"], "npud")
    toml = npud_toml()
    ports = {p["name"]: p["containerPort"] for p in npud["ports"]}
    assert ports["metrics"] == port_of(toml["metrics"]["listen"])
    assert ports["grpc-tls"] == port_of(toml["tcp"])
    notes = template["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert int(notes["prometheus.io/port"]) == port_of(toml["metrics"]["listen"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = npud[probe]["exec"]["command"]
        assert cmd[0] == "npuctl" and "health" in cmd, (probe, cmd)
        assert cmd[cmd.index("--addr") + 1] == f"unix:{toml['socket']}", (probe, cmd)
    # npud reads the configuration the ConfigMap carries, and TLS files the Secret holds.
    (cfg_arg,) = [a for a in npud["command"] if a.endswith(".toml")]
    v, _ = volume_of(template["spec"], npud, str(pathlib.PurePosixPath(cfg_arg).parent))
    assert v["configMap"]["name"] == "npud-config"
    assert pathlib.PurePosixPath(cfg_arg).name in [i["path"] for i in v["configMap"]["items"]]
    tls_dir = pathlib.PurePosixPath(toml["tls"]["cert"]).parent
    v, _ = volume_of(template["spec"], npud, str(tls_dir))
    paths = [i["path"] for i in v["secret"]["items"]]
    for key in ("cert", "key", "client_ca"):
        f = pathlib.PurePosixPath(toml["tls"][key])
        assert f.parent == tls_dir and f.name in paths, (key, f, paths)


def test_services_select_the_daemonsets_pods_and_name_its_ports():
    ds = by_kind("DaemonSet")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"] for p in container(ds["spec"]["template"]["spec"], "npud")["ports"]}
    for name in ("npud", "npud-fleet"):
        svc = by_kind("Service", name)
        assert svc["spec"]["selector"].items() <= labels.items(), name
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, (name, p)
    assert by_kind("Service", "npud-fleet")["spec"]["clusterIP"] == "None"


def test_npud_runs_only_on_labelled_nodes_and_the_label_is_documented():
    ds = by_kind("DaemonSet")
    key, value = NODE_LABEL
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {key: value}
    readme = (DEPLOY / "README.md").read_text()
    assert f"kubectl label node" in readme and f"{key}={value}" in readme
    # Only npud gets device nodes.
    spec = ds["spec"]["template"]["spec"]
    for c in spec["containers"] + spec["initContainers"]:
        for m in c.get("volumeMounts", []):
            if m["mountPath"].startswith("/dev"):
                assert c["name"] == "npud", (c["name"], m)
