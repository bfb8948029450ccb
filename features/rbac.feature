@fake-coderd
Feature: RBAC of the provisioner and of the operator
  The provisioner pods manage workspace pods and volumes through a Role bound to their
  ServiceAccount. The operator can only grant that Role if its own ClusterRole holds the same
  verbs (Kubernetes forbids RBAC escalation): the PR's first bug.

  Background:
    Given a Ready control plane with operator access

  @R-RBAC-1 @R-RBAC-2 @R-RBAC-3 @R-RES-1 @core
  Scenario: The provisioner's Role, RoleBinding and ServiceAccount
    When the sample provisioner is applied
    # checks: R-RBAC-1
    Then the Role "provisioner-{provisioner}" has exactly these rules:
      | apiGroups | resources                    | verbs                                           |
      | ""        | pods, persistentvolumeclaims | get, list, watch, create, update, patch, delete |
    # checks: R-RBAC-2
    And the RoleBinding "provisioner-{provisioner}" binds Role "provisioner-{provisioner}" to ServiceAccount "{provisioner}-provisioner"
    # checks: R-RBAC-3, R-RES-1
    And these objects exist, controlled by the provisioner:
      | kind           | name                      |
      | ServiceAccount | {provisioner}-provisioner |
      | Role           | provisioner-{provisioner} |
      | RoleBinding    | provisioner-{provisioner} |

  @R-RES-6 @PR @operator-identity @core
  Scenario: The operator's own RBAC allows granting the provisioner's Role
    Then the operator's ServiceAccount may get, list, watch, create, update, patch and delete pods and persistentvolumeclaims

  @R-RES-6 @PR @core
  Scenario: Under its own RBAC the operator brings a provisioner to Ready
    When the sample provisioner is applied
    Then the provisioner becomes Ready
