"""Issue 29's API surface: spec.pod (with the operator-owned fields and the unsafe settings refused), the
model cache, rollout / disruption budget, apiKeySecret and status.url — as the webhook and gdnctl read them."""

import pytest

from gdn_operator.api.crd import PRINTER_COLUMNS
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.api.pod import UNSAFE_OPT_INS, unsafe_refusals
from gdn_operator.settings import Settings, SettingsError

from builders import GMS, MODEL, POD_SETTINGS

V32 = GMS().version("0.32.0")


def refused(**kw) -> str:
    with pytest.raises(ManifestError) as ei:
        parse_spec(V32.update(**kw).spec())
    return " ".join(ei.value.problems)


def test_pod_settings_parse():
    s = parse_spec(
        V32.update(
            pod=POD_SETTINGS,
            env=[{"name": "S3_ENDPOINT", "configMapKeyRef": {"name": "storage", "key": "endpoint"}}],
        ).spec()
    )
    assert s.pod.service_account_name == "vllm-reader"
    assert s.env[0].config_map_key_ref.key == "endpoint"
    assert unsafe_refusals(s) == []


@pytest.mark.parametrize(
    "key, instead",
    [
        ("containers", "the operator renders the engine container"),
        ("command", "spec.extraArgs"),
        ("args", "spec.extraArgs"),
        ("ports", "port 8000"),
        ("resources", "spec.resources"),
        ("livenessProbe", "spec.startupBudgetSeconds"),
        ("nodeSelector", "spec.nodeSelector"),
        ("tolerations", "spec.tolerations"),
        ("affinity", "spec.affinity"),
        ("env", "spec.env"),
        ("terminationGracePeriodSeconds", "spec.shutdownTimeoutSeconds"),
        ("hostNetwork", "network"),
    ],
)
def test_operator_owned_pod_fields_refused_naming_the_field_to_use(key, instead):
    msg = refused(pod={key: {} if key not in ("hostNetwork",) else True})
    assert f"spec.pod.{key} is owned by the operator" in msg and instead in msg, msg


@pytest.mark.parametrize(
    "pod, text",
    [
        ({"labels": {"app.kubernetes.io/instance": "x"}}, "label 'app.kubernetes.io/instance' is set by the operator"),
        ({"labels": {"serving.gdn-operator.io/server": "x"}}, "is set by the operator"),
        ({"annotations": {"kubectl.kubernetes.io/default-container": "x"}}, "is set by the operator"),
        ({"volumes": [{"name": "cache", "emptyDir": {}}]}, "'cache' is the operator's volume"),
        ({"volumes": [{"name": "a", "emptyDir": {}, "secret": {"secretName": "s"}}]}, "exactly one volume source"),
        ({"volumes": [{"name": "a", "emptyDir": {"sizeLimt": "1Gi"}}]}, "unknown field"),
        ({"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}, "is not a volume of spec.pod.volumes"),
        (
            {"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "a", "mountPath": "/cache/x"}]},
            "overlaps the operator's mount /cache",
        ),
        (
            {"volumes": [{"name": "a", "emptyDir": {}}], "volumeMounts": [{"name": "a", "mountPath": "/dev"}]},
            "overlaps the operator's mount /dev/shm",
        ),
        ({"securityContext": {"runAsUser": "root"}}, "securityContext"),
        ({"serviceAccountName": "Not_A_Name"}, "not a valid object name"),
    ],
)
def test_bad_pod_settings_name_the_field(pod, text):
    msg = refused(pod=pod)
    assert text in msg and "spec.pod" in msg, msg


def test_configmap_env_names_are_checked_like_any_env():
    assert "set spec.model.hfTokenSecret instead" in refused(
        env=[{"name": "HF_TOKEN", "configMapKeyRef": {"name": "c", "key": "k"}}]
    )
    assert "one of value, secretKeyRef or configMapKeyRef" in refused(
        env=[{"name": "A", "value": "1", "configMapKeyRef": {"name": "c", "key": "k"}}]
    )


UNSAFE = [
    ("gpu-visibility-env", {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "spec.env[0] 'NVIDIA_VISIBLE_DEVICES'"),
    ("gpu-visibility-env", {"env": [{"name": "CUDA_VISIBLE_DEVICES", "value": "0,1"}]}, "'CUDA_VISIBLE_DEVICES'"),
    ("gpu-visibility-env", {"env": [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"}]}, "'NVIDIA_DRIVER_CAPABILITIES'"),
    ("gpu-visibility-env", {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "secretKeyRef": {"name": "s"}}]}, "NVIDIA_VISIBLE"),
    ("insecure-serialization", {"env": [{"name": "VLLM_ALLOW_INSECURE_SERIALIZATION", "value": "1"}]}, "unpickle"),
    ("env-from", {"pod": {"envFrom": [{"secretRef": {"name": "all-of-it"}}]}}, "spec.pod.envFrom"),
    ("host-path", {"pod": {"volumes": [{"name": "h", "hostPath": {"path": "/var/lib"}}]}}, "spec.pod.volumes[0].hostPath"),
    ("privileged", {"pod": {"containerSecurityContext": {"privileged": True}}}, "privileged"),
    ("capabilities", {"pod": {"containerSecurityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}}, "capabilities.add"),
    ("local-media-path", {"extraArgs": ["--allowed-local-media-path", "/"]}, "/ lets requests read every file"),
    ("local-media-path", {"extraArgs": ["--allowed-local-media-path=/etc"]}, "is not inside a spec.pod.volumeMounts path"),
]


@pytest.mark.parametrize("opt_in, fields, text", UNSAFE)
def test_unsafe_settings_refused_unless_opted_in_naming_the_chart_value(opt_in, fields, text):
    s = parse_spec(V32.update(**fields).spec())
    found = unsafe_refusals(s)
    assert len(found) == 1 and text in found[0], found
    assert f"operator.allowUnsafe (GDN_ALLOW_UNSAFE) lists {opt_in}" in found[0]
    assert unsafe_refusals(s, (opt_in,)) == []
    assert unsafe_refusals(s, tuple(o for o in UNSAFE_OPT_INS if o != opt_in)) == found  # only its own opt-in


def test_local_media_path_inside_a_mounted_media_volume_is_admitted():
    s = parse_spec(
        V32.update(
            extraArgs=["--allowed-local-media-path", "/media/images"],
            pod={
                "volumes": [{"name": "media", "persistentVolumeClaim": {"claimName": "media", "readOnly": True}}],
                "volumeMounts": [{"name": "media", "mountPath": "/media", "readOnly": True}],
            },
        ).spec()
    )
    assert unsafe_refusals(s) == []
    assert unsafe_refusals(parse_spec(V32.update(extraArgs=["--allowed-local-media-path", "/mediax"], pod=s.pod.dump()).spec()))


def test_allow_unsafe_setting_parses_and_names_the_choices():
    assert Settings.from_env({"GDN_ALLOW_UNSAFE": "host-path, privileged"}).allow_unsafe == ("host-path", "privileged")
    with pytest.raises(SettingsError, match="unknown opt-in everything.*gpu-visibility-env"):
        Settings.from_env({"GDN_ALLOW_UNSAFE": "everything"})


def test_model_cache_choices():
    s = parse_spec(
        V32.update(
            model={"uri": MODEL, "cache": {"persistentVolumeClaim": {"size": "200Gi", "storageClassName": "fast"}}}, replicas=3
        ).spec()
    )
    assert s.model.cache.persistent_volume_claim.access_mode == "ReadWriteMany"
    assert "claimName (an existing claim) or size" in refused(model={"uri": MODEL, "cache": {"persistentVolumeClaim": {}}})
    assert "emptyDir or persistentVolumeClaim, not both" in refused(
        model={"uri": MODEL, "cache": {"emptyDir": {}, "persistentVolumeClaim": {"claimName": "c"}}}
    )
    assert "applies to hf:// models" in refused(
        model={"uri": "pvc://weights/q", "cache": {"persistentVolumeClaim": {"size": "1Gi"}}}
    )
    assert "not an http(s) URL" in refused(model={"uri": MODEL, "hubEndpoint": "ftp://mirror"})


@pytest.mark.parametrize(
    "extra, where",
    [
        ({"replicas": 2}, "replicas 2"),
        ({"autoscaling": {"maxReplicas": 4, "target": 5}}, "autoscaling"),
        ({"nodes": 2, "tensorParallelSize": 2}, "nodes 2"),
    ],
)
def test_single_node_claim_refused_for_several_pods(extra, where):
    cache = {"persistentVolumeClaim": {"claimName": "weights", "accessMode": "ReadWriteOnce"}}
    msg = refused(model={"uri": MODEL, "cache": cache}, **extra)
    assert "accessMode ReadWriteOnce" in msg and where in msg and "ReadWriteMany" in msg and "emptyDir" in msg, msg
    parse_spec(V32.update(model={"uri": MODEL, "cache": cache}).spec())  # one pod: fine


def test_rollout_and_disruption_budget():
    s = parse_spec(V32.update(rollout={"strategy": "InPlace"}, disruptionBudget={"maxUnavailable": 2}).spec())
    assert (s.rollout.max_surge, s.rollout.max_unavailable) == (0, 1)
    assert (parse_spec(V32.spec()).rollout.max_surge, parse_spec(V32.spec()).rollout.max_unavailable) == (1, 0)
    assert "Input should be 'Surge' or 'InPlace'" in refused(rollout={"strategy": "Recreate"})
    assert "no effect with enabled: false" in refused(disruptionBudget={"enabled": False, "maxUnavailable": 1})


def test_api_key_secret_and_url_column():
    assert parse_spec(V32.update(apiKeySecret={"name": "vllm-key", "key": "key"}).spec()).api_key_secret.name == "vllm-key"
    assert "set spec.apiKeySecret instead" in refused(env=[{"name": "VLLM_API_KEY", "value": "sk"}])
    assert any(c["jsonPath"] == ".status.url" and not c.get("priority") for c in PRINTER_COLUMNS)
