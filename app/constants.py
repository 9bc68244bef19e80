"""Names Tessera uses in the API: resources, labels and annotations."""

from __future__ import annotations

# Resources a pod may ask for.
CPU = "cpu"
MEMORY = "memory"
GPU = "nvidia.com/gpu"  # whole GPUs
GPU_MEMORY = "tessera.io/gpu-memory"  # VRAM of ONE GPU, for a slice (e.g. "20Gi")
GPU_CORE = "tessera.io/gpu-core"  # share of that GPU's SMs, percent 1..100
EPHEMERAL_STORAGE = "ephemeral-storage"  # accepted, not sold separately
KNOWN_RESOURCES = (CPU, MEMORY, GPU, GPU_MEMORY, GPU_CORE, EPHEMERAL_STORAGE)

# Labels.
LABEL_COMPUTE_CLASS = "tessera.io/compute-class"
LABEL_COMPUTE_QOS = "tessera.io/compute-qos"
LABEL_GPU_MODEL = "tessera.io/gpu-model"
LABEL_POD_GROUP = "tessera.io/pod-group"  # the gang a pod belongs to
# The same, for a scheduler-plugins coscheduling PodGroup (scheduling.x-k8s.io/v1alpha1).
LABEL_COSCHEDULING_POD_GROUP = "scheduling.x-k8s.io/pod-group"
LABEL_RACK = "tessera.io/rack"
LABEL_NVLINK_DOMAIN = "tessera.io/nvlink-domain"
LABEL_REGION = "topology.kubernetes.io/region"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_HOSTNAME = "kubernetes.io/hostname"
# The runtime that runs a node's pods (docker or virtual): its agent's to set, the one label a
# node agent may change (a pod asks for a real container with a nodeSelector on it).
LABEL_RUNTIME = "tessera.io/runtime"

COMPUTE_CLASSES = ("general-purpose", "performance", "gpu")
COMPUTE_QOS = ("default", "best-effort")

# Annotations.
ANNOTATION_POD_USE_SPEC = "tessera.io/pod-use-spec"
ANNOTATION_GPU_ALLOCATION = "tessera.io/gpu-allocation"
# The class admission derived (from the label when the user set it, else from the resources):
# an annotation, so a pod's labels are only those its user wrote.
ANNOTATION_COMPUTE_CLASS = "tessera.io/compute-class"
# "true": a BestEffort pod preempted for a regular one returns to Pending (same name) instead
# of ending Failed with reason Preempted.
ANNOTATION_REQUEUE_ON_PREEMPTION = "tessera.io/requeue-on-preemption"
# "true": a pod whose GPU failed returns to Pending (same name) and is placed again on healthy
# capacity instead of ending Failed with reason GPUFault (a gang member takes its gang along).
ANNOTATION_RESCHEDULE_ON_FAULT = "tessera.io/reschedule-on-fault"
# The device taint a GPU fault puts on the GPU (effect NoExecute); an admin's drain uses its own.
TAINT_GPU_FAULT = "tessera.io/gpu-fault"

# On a scheduling.x-k8s.io PodGroup: the topology level its members must / should share
# (values as a tessera.io PodGroup's spec.topology: nvlink, node, rack, zone).
ANNOTATION_TOPOLOGY_REQUIRED = "tessera.io/topology-required"
ANNOTATION_TOPOLOGY_PREFERRED = "tessera.io/topology-preferred"

# Labels whose value decides placement and price: fixed once the pod exists.
IMMUTABLE_POD_LABELS = (
    LABEL_COMPUTE_CLASS,
    LABEL_COMPUTE_QOS,
    LABEL_GPU_MODEL,
    LABEL_POD_GROUP,
    LABEL_COSCHEDULING_POD_GROUP,
)

TESSERA_GROUP = "tessera.io"
TESSERA_VERSION = "v1"
BILLING_GROUP = "billing.tessera.io"  # prices, commitments, statements, usage
# scheduler-plugins' coscheduling PodGroup, served beside tessera.io's.
SCHEDULING_GROUP = "scheduling.x-k8s.io"
SCHEDULING_VERSION = "v1alpha1"

# The groups of the access reviews (`kubectl auth can-i`, `kubectl auth whoami`).
AUTHORIZATION_GROUP = "authorization.k8s.io"
POLICY_GROUP = "policy"  # only for pods/eviction
AUTHENTICATION_GROUP = "authentication.k8s.io"

# Namespaces that belong to no tenant and are never deleted.
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-system", "tessera-system")
# Where each node agent keeps its heartbeat: a Lease named like the node.
NODE_LEASE_NAMESPACE = "kube-node-lease"
COORDINATION_GROUP = "coordination.k8s.io"

# Capabilities a container may add (`securityContext.capabilities.add`): the container engine's
# default set less NET_RAW (raw sockets on a network shared with the tenant's other pods), which
# the node agent always drops. Any other is refused at admission.
SAFE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
METRICS_GROUP = "metrics.k8s.io"  # resource usage (`kubectl top`), as metrics-server serves it
