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
    Then the operator's ServiceAccount may, in the provisioner's namespace:
      | resource               | verbs                                           |
      | pods                   | get, list, watch, create, update, patch, delete |
      | persistentvolumeclaims | get, list, watch, create, update, patch, delete |

  # What the operator reads, watches (R-W-1, R-W-2, R-CRED-11) and writes. Setting
  # blockOwnerDeletion on a child needs update on its owner's finalizers.
  @R-RES-6 @operator-identity @core
  Scenario: The operator's own RBAC covers what it watches and manages
    Then the operator's ServiceAccount may, in the provisioner's namespace:
      | resource                               | verbs                                     |
      | codercontrolplanes.coder.com           | get, list, watch                          |
      | coderprovisioners.coder.com            | get, list, watch, update or patch         |
      | coderprovisioners.coder.com/status     | update or patch                           |
      | coderprovisioners.coder.com/finalizers | update                                    |
      | secrets                                | get, list, watch, create, update or patch |
      | serviceaccounts                        | get, list, watch, create, update or patch |
      | roles.rbac.authorization.k8s.io        | get, list, watch, create, update or patch |
      | rolebindings.rbac.authorization.k8s.io | get, list, watch, create, update or patch |
      | deployments.apps                       | get, list, watch, create, update or patch |

  @R-RES-6 @PR @core
  Scenario: Under its own RBAC the operator brings a provisioner to Ready
    When the sample provisioner is applied
    Then the provisioner becomes Ready
