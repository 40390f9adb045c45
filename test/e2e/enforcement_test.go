package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/limiterd/limiterd/api/v1alpha1"
	"github.com/limiterd/limiterd/controllers"
	"github.com/limiterd/limiterd/internal/testenv"
	"github.com/limiterd/limiterd/internal/testsupport"
)

// enforcedDeadline is how soon after a policy is created its status must say that every
// replica enforces it.
const enforcedDeadline = 5 * time.Second

// installLimiterdAccess applies limiterd's RBAC and its status admission policy from config/.
func installLimiterdAccess(t *testing.T, env *testenv.Env) {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	rbac := filepath.Join(root, "config", "rbac")
	mustKubectl(t, env, "", "apply", "--namespace", statusNamespace,
		"-f", filepath.Join(rbac, "limiterd_role.yaml"),
		"-f", filepath.Join(rbac, "limiterd_role_binding.yaml"),
		"-f", filepath.Join(rbac, "limiterd_status_role.yaml"))
	mustKubectl(t, env, "", "apply", "-f", filepath.Join(root, "config", "limiterd", "status_admission.yaml"))
}

func replicaLease(namespace, name string, labelled bool) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if labelled {
		l.Labels = map[string]string{v1alpha1.ReplicaLabel: name}
	}
	return l
}

// checkAdmission checks that limiterd's service account may write only the Lease of its own
// pod, labelled as a replica record, in the status namespace.
func checkAdmission(t *testing.T, env *testenv.Env) {
	ctx := t.Context()
	a := clientFor(t, env, impersonatingKubeconfig(t, env, "limiterd-a"))
	denied := func(what string, err error, message string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), message) {
			t.Errorf("%s: %v; want refused with %q", what, err, message)
		}
	}

	// The admission policy takes effect once the API server has loaded it.
	testsupport.Eventually(t, waitTimeout, "limiterd-a refused the Lease of limiterd-b", func() error {
		err := a.Create(ctx, replicaLease(statusNamespace, "limiterd-b", true))
		if err == nil {
			_ = env.Client.Delete(ctx, replicaLease(statusNamespace, "limiterd-b", true))
			return errors.New("limiterd-a created the Lease of limiterd-b")
		}
		if !strings.Contains(err.Error(), "may write only the Lease limiterd-a, not limiterd-b") {
			return fmt.Errorf("create another pod's Lease: %w", err)
		}
		return nil
	})
	denied("create an unlabelled own Lease", a.Create(ctx, replicaLease(statusNamespace, "limiterd-a", false)),
		"must be labelled limiterd.dev/replica=limiterd-a")
	denied("create in another namespace", a.Create(ctx, replicaLease("default", "limiterd-a", true)),
		`cannot create resource "leases"`)
	denied("list Leases", a.List(ctx, &coordinationv1.LeaseList{}, client.InNamespace(statusNamespace)),
		`cannot list resource "leases"`)
	noPod := clientFor(t, env, impersonatingKubeconfig(t, env, ""))
	denied("create without a pod-bound token", noPod.Create(ctx, replicaLease(statusNamespace, "limiterd-a", true)),
		"only with a pod-bound service account token")

	own := replicaLease(statusNamespace, "limiterd-a", true)
	if err := a.Create(ctx, own); err != nil {
		t.Fatalf("create its own Lease: %v", err)
	}
	own.Annotations = map[string]string{v1alpha1.ReplicaStatusAnnotation: "{}"}
	if err := a.Update(ctx, own); err != nil {
		t.Errorf("update its own Lease: %v", err)
	}
	own.Labels = nil
	denied("remove its own Lease's label", a.Update(ctx, own), "must be labelled")

	other := replicaLease(statusNamespace, "limiterd-b", true)
	if err := env.Client.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := a.Get(ctx, client.ObjectKeyFromObject(other), other); err != nil {
		t.Fatalf("get another Lease: %v", err)
	}
	other.Annotations = map[string]string{v1alpha1.ReplicaStatusAnnotation: "{}"}
	denied("update another pod's Lease", a.Update(ctx, other), "may write only the Lease limiterd-a")
	denied("delete another pod's Lease", a.Delete(ctx, other), "may write only the Lease limiterd-a")
	if err := a.Delete(ctx, replicaLease(statusNamespace, "limiterd-a", true)); err != nil {
		t.Errorf("delete its own Lease: %v", err)
	}
	if err := env.Client.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}
}

// dryRunPolicy is policy ns/api whose default tier is a dry run of one request an hour.
func dryRunPolicy(ns string) *v1alpha1.RateLimitPolicy {
	return &v1alpha1.RateLimitPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api"},
		Spec: v1alpha1.RateLimitPolicySpec{
			DefaultTier: "shadow",
			Tiers: []v1alpha1.Tier{{
				Name: "shadow", Algorithm: v1alpha1.AlgorithmTokenBucket, DryRun: true,
				TokenBucket: &v1alpha1.TokenBucket{Capacity: 1, RefillRate: 1, RefillPeriod: &metav1.Duration{Duration: time.Hour}},
			}},
		},
	}
}

// enforcedAs checks a policy's status: generation observed, Enforced condition's status and
// reason, and status.enforced.
func enforcedAs(p *v1alpha1.RateLimitPolicy, gen int64, status metav1.ConditionStatus, reason, enforced string) error {
	c := meta.FindStatusCondition(p.Status.Conditions, controllers.ConditionEnforced)
	if p.Status.ObservedGeneration != gen || c == nil || c.ObservedGeneration != gen || c.Status != status ||
		c.Reason != reason || p.Status.Enforced != enforced {
		return fmt.Errorf("status: generation %d, enforced %q, condition %+v; want generation %d, %s %s, %s",
			p.Status.ObservedGeneration, p.Status.Enforced, c, gen, status, reason, enforced)
	}
	return nil
}

// TestEnforcementStatus runs the operator and three limiterd replicas, each as the limiterd
// service account of its own pod, and checks the policy status they make: Enforced with 3/3,
// the dry-run rejections summed, a crashed replica dropping out once its record expires, and a
// ConfigMap the replicas cannot parse reported as RejectedByReplica.
func TestEnforcementStatus(t *testing.T) {
	managerBin, limiterdBin := binaries(t)
	env := testenv.New(t)
	ctx := t.Context()
	createNamespace(t, env, statusNamespace)
	installLimiterdAccess(t, env)
	t.Run("limiterd writes only its own record", func(t *testing.T) { checkAdmission(t, env) })
	if t.Failed() {
		return
	}

	startManager := func(t *testing.T) *process {
		return startProcess(t, "manager", env.KubeconfigPath(), managerBin,
			"--metrics-bind-address=0", "--health-probe-bind-address="+freeAddr(t))
	}
	manager := startManager(t)
	replicas := make([]*limiterd, 3)
	for i := range replicas {
		name := fmt.Sprintf("limiterd-%d", i)
		replicas[i] = startLimiterd(t, name, impersonatingKubeconfig(t, env, name), limiterdBin,
			"--replica-name="+name, "--status-namespace="+statusNamespace, "--status-interval=1s")
	}

	ns := env.Namespace(t)
	key := client.ObjectKey{Namespace: ns, Name: "api"}
	policyID := ns + "/api"
	p := dryRunPolicy(ns)
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	current := func(t *testing.T) *v1alpha1.RateLimitPolicy {
		t.Helper()
		got := &v1alpha1.RateLimitPolicy{}
		if err := env.Client.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		return got
	}

	t.Run("enforced by 3/3 within 5s", func(t *testing.T) {
		for {
			got := current(t)
			err := enforcedAs(got, 1, metav1.ConditionTrue, controllers.ReasonEnforced, "3/3")
			if err == nil && (got.Status.Replicas != 3 || got.Status.EnforcedReplicas != 3 ||
				got.Status.DryRunRejected == nil || *got.Status.DryRunRejected != 0) {
				err = fmt.Errorf("replicas %d, enforcedReplicas %d, dryRunRejected %v; want 3, 3, 0",
					got.Status.Replicas, got.Status.EnforcedReplicas, got.Status.DryRunRejected)
			}
			if err == nil {
				t.Logf("enforced 3/3 %v after the policy was created", time.Since(created).Round(time.Millisecond))
				break
			}
			if time.Since(created) > enforcedDeadline {
				t.Fatalf("not within %v: %v", enforcedDeadline, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		out := mustKubectl(t, env, "", "get", "ratelimitpolicies", "--namespace", ns)
		if lines := strings.Split(out, "\n"); !strings.Contains(lines[0], "ENFORCED") || !strings.Contains(lines[1], "3/3") {
			t.Errorf("kubectl get shows no ENFORCED 3/3:\n%s", out)
		}
	})

	t.Run("dry-run rejections are summed over replicas", func(t *testing.T) {
		c := &http.Client{Timeout: 10 * time.Second}
		for i, n := range map[int]int{0: 5, 1: 3} { // capacity 1: 4 and 2 would have been rejected
			for range n {
				if a, err := decide(c, replicas[i].decisions, policyID, "client"); err != nil || a.status != http.StatusOK {
					t.Fatalf("dry-run decision: %d %v, want 200", a.status, err)
				}
			}
		}
		testsupport.Eventually(t, waitTimeout, "dry-run rejections counted", func() error {
			got := current(t)
			if d := got.Status.DryRunRejected; d == nil || *d != 6 {
				return fmt.Errorf("dryRunRejected %v, want 6", d)
			}
			return nil
		})
	})

	t.Run("a crashed replica drops out once its record expires", func(t *testing.T) {
		replicas[2].kill()
		testsupport.Eventually(t, waitTimeout, "enforced by 2/2", func() error {
			got := current(t)
			if err := enforcedAs(got, 1, metav1.ConditionTrue, controllers.ReasonEnforced, "2/2"); err != nil {
				return err
			}
			if got.Status.Replicas != 2 {
				return fmt.Errorf("replicas %d, want 2", got.Status.Replicas)
			}
			return nil
		})
		// Its record is still there: it expired, it was not withdrawn.
		l := &coordinationv1.Lease{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: statusNamespace, Name: "limiterd-2"}, l); err != nil {
			t.Fatalf("the crashed replica's Lease: %v", err)
		}
		rep, err := v1alpha1.ReplicaFromLease(l)
		if err != nil || rep.Live(time.Now()) {
			t.Errorf("the crashed replica's record: live %v, %v; want expired", rep.Live(time.Now()), err)
		}
	})

	t.Run("a ConfigMap the replicas cannot parse is RejectedByReplica", func(t *testing.T) {
		// Deterministic: with the operator stopped, generation 2 goes into the ConfigMap broken,
		// and the replicas' records say so before the operator starts again. The operator reads
		// the records before it rewrites the ConfigMap, so the first status it writes for
		// generation 2 reports the rejection; then the replicas take the rewritten ConfigMap.
		manager.stop(t)
		p := current(t)
		p.Spec.Tiers[0].TokenBucket.Capacity = 2
		if err := env.Client.Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		if p.Generation != 2 {
			t.Fatalf("generation %d after an update, want 2", p.Generation)
		}
		data, err := v1alpha1.RenderConfigMapData(p)
		if err != nil {
			t.Fatal(err)
		}
		data[v1alpha1.ConfigMapDataKey] = strings.Replace(data[v1alpha1.ConfigMapDataKey], "capacity:", "capacty:", 1)
		cm := &corev1.ConfigMap{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: statusNamespace, Name: v1alpha1.ConfigMapName(v1alpha1.NewPolicyID(ns, "api"))}, cm); err != nil {
			t.Fatal(err)
		}
		cm.Data = data
		if err := env.Client.Update(ctx, cm); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"limiterd-0", "limiterd-1"} {
			testsupport.Eventually(t, waitTimeout, name+" reports the rejection", func() error {
				l := &coordinationv1.Lease{}
				if err := env.Client.Get(ctx, client.ObjectKey{Namespace: statusNamespace, Name: name}, l); err != nil {
					return err
				}
				rep, err := v1alpha1.ReplicaFromLease(l)
				if err != nil {
					return err
				}
				s := rep.Record[v1alpha1.PolicyID(policyID)]
				if s.State != v1alpha1.ReplicaRejected || s.Generation != 2 || s.ServingGeneration != 1 ||
					!strings.Contains(s.Error, "capacty") {
					return fmt.Errorf("%s reports %+v, want generation 2 rejected naming the field", name, s)
				}
				return nil
			})
		}
		for _, r := range replicas[:2] {
			if a, err := decide(&http.Client{Timeout: 10 * time.Second}, r.decisions, policyID, "fresh"); err != nil || a.status != http.StatusOK || a.limitOf() != "1" {
				t.Errorf("%s after the bad ConfigMap: %d, limit %s, %v; want generation 1 (limit 1) served", r.name, a.status, a.limitOf(), err)
			}
		}

		w, err := env.Client.Watch(ctx, &v1alpha1.RateLimitPolicyList{}, client.InNamespace(ns))
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		startManager(t)
		var seen []string
		rejected, enforced := false, false
		deadline := time.After(waitTimeout)
		for !enforced {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					t.Fatalf("watch closed; conditions seen: %v", seen)
				}
				got, isPolicy := ev.Object.(*v1alpha1.RateLimitPolicy)
				if ev.Type != watch.Modified || !isPolicy {
					continue
				}
				c := meta.FindStatusCondition(got.Status.Conditions, controllers.ConditionEnforced)
				if c == nil || c.ObservedGeneration != 2 {
					continue
				}
				seen = append(seen, c.Reason+": "+c.Message)
				if c.Reason == controllers.ReasonRejectedByReplica && !rejected {
					// The first status of generation 2 names every replica: later ones may
					// name fewer, as replicas take the rewritten ConfigMap.
					rejected = true
					for _, want := range []string{"limiterd-0", "limiterd-1", "capacty"} {
						if !strings.Contains(c.Message, want) {
							t.Errorf("RejectedByReplica message %q does not name %s", c.Message, want)
						}
					}
				}
				enforced = enforcedAs(got, 2, metav1.ConditionTrue, controllers.ReasonEnforced, "2/2") == nil
			case <-deadline:
				t.Fatalf("generation 2 not enforced within %v; conditions seen: %v", waitTimeout, seen)
			}
		}
		if !rejected {
			t.Errorf("no RejectedByReplica before generation 2 was enforced; conditions seen: %v", seen)
		}
		t.Logf("Enforced conditions of generation 2: %v", seen)
	})
}
