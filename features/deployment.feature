@fake-coderd
Feature: The provisioner Deployment
  The Deployment runs `coder provisioner start` with the key from the key Secret. The PR fixed
  the daemon's command line: command ["coder"], args "provisioner start", and no
  CODER_ORGANIZATION (the CLI refuses --org together with --key).

  Background:
    Given a Ready control plane with operator access

  @R-POD-9 @R-POD-10 @PR @core
  Scenario: The daemon runs "coder provisioner start"
    When the sample provisioner is applied
    # checks: R-POD-9
    Then the provisioner container's command is '["coder"]'
    # checks: R-POD-10
    And the provisioner container's args are '["provisioner", "start"]'

  @R-POD-10 @core
  Scenario: extraArgs follow "provisioner start" in order
    When the sample provisioner is applied with spec:
      """
      extraArgs: ["--verbose", "--log-human=/dev/stderr"]
      """
    Then the provisioner container's args are '["provisioner", "start", "--verbose", "--log-human=/dev/stderr"]'

  @R-POD-11 @R-POD-12 @R-POD-13 @R-POD-14 @PR @core
  Scenario: The daemon gets the coderd URL and the key, and no organization
    When the sample provisioner is applied with spec:
      """
      extraEnv:
        - name: CODER_VERBOSE
          value: "true"
      """
    # checks: R-POD-11, R-POD-12, R-POD-13
    Then the provisioner container's env is:
      | name                         | value | secret                            |
      | CODER_URL                    | {url} |                                   |
      | CODER_PROVISIONER_DAEMON_KEY |       | {provisioner}-provisioner-key/key |
      | CODER_VERBOSE                | true  |                                   |
    # checks: R-POD-14
    And the provisioner container has no env var "CODER_ORGANIZATION"

  @R-POD-8 @core
  Scenario: The image comes from the spec
    When the sample provisioner is applied with spec:
      """
      image: example.com/coder:v2.30.0
      """
    Then the provisioner container's image is "example.com/coder:v2.30.0"

  @R-POD-8 @core
  Scenario: Without an image in the spec the control plane's image is used
    Given the control plane's spec is changed to:
      """
      image: example.com/coderd:v2.29.1
      """
    When the sample provisioner is applied
    Then the provisioner container's image is "example.com/coderd:v2.29.1"

  @R-POD-8 @core
  Scenario: Without any image the default image is used
    Given the control plane's spec has no image
    When the sample provisioner is applied
    Then the provisioner container's image is "ghcr.io/coder/coder:latest"

  @R-POD-1 @core
  Scenario Outline: The Deployment runs <expected> replica(s) for spec.replicas <replicas>
    When the sample provisioner is applied with spec:
      """
      replicas: <replicas>
      """
    Then the provisioner Deployment has <expected> replicas

    Examples:
      | replicas | expected |
      | 3        | 3        |
      | 0        | 0        |
      | null     | 1        |

  # A spec the schema cannot reject (a negative quantity) is refused by the API server when the
  # Deployment is applied: the status says so, the key made for it stays the one key.
  @R-KEY-8 @R-ST-5 @extended
  Scenario: A Deployment the API server refuses is reported and its key is kept
    When the sample provisioner is applied with spec:
      """
      resources: {requests: {cpu: "-1"}}
      """
    # checks: R-ST-5
    Then the provisioner has condition "DeploymentReady" "False" with reason "NoReplicasReady"
    # checks: R-ST-5
    And the DeploymentReady condition's message mentions "cpu"
    # checks: none
    And the provisioner status records its provisioner key
    # checks: R-KEY-8
    And coderd sees no provisioner key requests from now on during the observation window
    When the provisioner spec is changed to:
      """
      resources: {requests: {cpu: 100m}}
      """
    # checks: none
    Then the provisioner becomes Ready
    # checks: R-KEY-8
    And coderd saw exactly 1 POST on "provisionerkeys"
    # checks: R-KEY-8
    And coderd saw no DELETE on "provisionerkey"

  @R-POD-16 @extended
  Scenario: The container gets the resources of the spec
    When the sample provisioner is applied with spec:
      """
      resources:
        requests:
          cpu: 250m
          memory: 256Mi
        limits:
          memory: 1Gi
      """
    Then the provisioner container's resources are:
      """
      requests:
        cpu: 250m
        memory: 256Mi
      limits:
        memory: 1Gi
      """

  @R-POD-5 @R-POD-6 @extended
  Scenario: Image pull Secrets and the termination grace period come from the spec
    When the sample provisioner is applied with spec:
      """
      imagePullSecrets:
        - name: registry-credentials
      terminationGracePeriodSeconds: 30
      """
    # checks: R-POD-5, R-POD-6
    Then the provisioner pod spec has:
      """
      imagePullSecrets:
        - name: registry-credentials
      terminationGracePeriodSeconds: 30
      """

  @R-POD-6 @extended
  Scenario: Without a grace period in the spec the pods get 600 seconds
    When the sample provisioner is applied
    Then the provisioner pod spec has:
      """
      terminationGracePeriodSeconds: 600
      """

  @R-POD-4 @R-RES-1 @R-RES-3 @core
  Scenario: The pods run as the provisioner's ServiceAccount
    When the sample provisioner is applied
    # checks: R-POD-4, R-RES-1, R-RES-3
    Then the provisioner pod template uses ServiceAccount "{provisioner}-provisioner"

  # D-1's order: the pods run as the ServiceAccount, with the Role bound to it, so the Deployment
  # is written only once all three are.
  @D-1 @slow @core
  Scenario Outline: While the namespace refuses new <kind> no Deployment is written
    Given the namespace refuses new <kind>
    When the sample provisioner is applied
    Then no Deployment named "provisioner-{provisioner}" exists during the observation window
    When the namespace accepts new <kind> again
    # How soon depends on the operator's own error backoff: not D-1's to judge.
    # checks: none
    Then the provisioner becomes Ready

    Examples:
      | kind            |
      | ServiceAccounts |
      | Roles           |
      | RoleBindings    |

  @R-POD-3 @D-6 @R-KEY-10 @core
  Scenario: A key rotation rolls the pods
    Given the sample provisioner is Ready
    # checks: none
    Then the provisioner pod template is remembered
    When the provisioner key Secret is deleted
    # checks: R-POD-3, R-KEY-10, D-6
    Then the provisioner pod template changes

  @R-ST-2 @R-ST-3 @R-ST-4 @R-ST-5 @R-ST-6 @R-ST-9 @R-W-2 @core
  Scenario: A healthy provisioner reports every condition True
    When the sample provisioner is applied
    # checks: R-ST-2, R-ST-3, R-ST-6
    Then the provisioner becomes Ready
    # checks: R-ST-4
    And the provisioner's status observes its current generation
    # checks: R-ST-6, R-ST-9
    And the provisioner has condition "ControlPlaneReady" "True" with reason "ControlPlaneAvailable"
    # checks: R-ST-6, R-ST-9
    And the provisioner has condition "OperatorAccessReady" "True" with reason "OperatorAccessReady"
    # checks: R-ST-6, R-ST-9
    And the provisioner has condition "ExternalProvisionersEntitled" "True" with reason "Entitled"
    # checks: R-ST-6, R-ST-9
    And the provisioner has condition "ProvisionerKeyReady" "True" with reason "ProvisionerKeyReady"
    # checks: R-ST-6, R-ST-9
    And the provisioner has condition "ProvisionerKeySecretReady" "True" with reason "SecretReady"
    # checks: R-ST-6, R-ST-9
    And the provisioner has condition "CredentialsReady" "True" with reason "CredentialsValid"
    # checks: R-ST-5, R-ST-6, R-ST-9, R-W-2
    And the provisioner has condition "DeploymentReady" "True" with reason "MinimumReplicasReady"

  @R-POD-1 @R-POD-5 @R-POD-6 @R-POD-8 @R-POD-10 @R-POD-13 @R-POD-16 @R-KEY-4 @R-ST-4 @core
  Scenario Outline: Changing <field> after Ready updates the Deployment and keeps the key
    Given the sample provisioner is Ready
    # checks: none
    Then the Secret "{provisioner}-provisioner-key" holds a provisioner key
    When the provisioner spec is changed to:
      """
      <spec>
      """
    # checks: R-POD-1, R-POD-5, R-POD-6, R-POD-8, R-POD-10, R-POD-13, R-POD-16
    Then the Deployment "provisioner-{provisioner}" has at "<path>":
      """
      <value>
      """
    # checks: R-ST-4
    And the provisioner's status observes its current generation
    # checks: R-KEY-4
    And coderd sees no provisioner key requests since the last action during the observation window
    # checks: R-KEY-4
    And the Secret "{provisioner}-provisioner-key" keeps its provisioner key

    Examples:
      | field                         | spec                                              | path                                              | value                                |
      | image                         | {image: "example.com/coder:v2.31.0"}              | /spec/template/spec/containers/0/image            | example.com/coder:v2.31.0            |
      | replicas                      | {replicas: 2}                                     | /spec/replicas                                    | 2                                    |
      | extraArgs                     | {extraArgs: ["--verbose"]}                        | /spec/template/spec/containers/0/args             | ["provisioner", "start", "--verbose"] |
      | extraEnv                      | {extraEnv: [{name: CODER_VERBOSE, value: "true"}]} | /spec/template/spec/containers/0/env/2            | {name: CODER_VERBOSE, value: "true"} |
      | resources                     | {resources: {limits: {memory: 1Gi}}}              | /spec/template/spec/containers/0/resources        | {limits: {memory: 1Gi}}              |
      | imagePullSecrets              | {imagePullSecrets: [{name: registry-credentials}]} | /spec/template/spec/imagePullSecrets              | [{name: registry-credentials}]       |
      | terminationGracePeriodSeconds | {terminationGracePeriodSeconds: 30}               | /spec/template/spec/terminationGracePeriodSeconds | 30                                   |

  # Removing `replicas: 1` leaves the default, 1: a new generation whose pass changes no child.
  @R-ST-4 @core
  Scenario Outline: A later generation is observed, and conditions that did not change keep their transition times, after <edit>
    Given the sample provisioner is Ready
    Then the provisioner's conditions are remembered
    When the provisioner spec is changed to:
      """
      <spec>
      """
    Then the provisioner's status observes its current generation
    And the provisioner's conditions keep their last transition times

    Examples:
      | edit                                 | spec                     |
      | an edit of the Deployment            | extraArgs: ["--verbose"] |
      | an edit that changes no child object | replicas: null           |

  @R-ST-1 @R-ST-2 @R-ST-3 @R-ST-5 @core
  Scenario Outline: A Deployment with <replicas> ready replica(s) gives phase <phase>
    When the sample provisioner is applied with spec:
      """
      replicas: <replicas>
      """
    # checks: R-ST-1, R-ST-2, R-ST-3
    Then the provisioner status has:
      | field | value   |
      | phase | <phase> |
    # checks: R-ST-5
    And the provisioner has condition "DeploymentReady" "<status>" with reason "<reason>"
    # checks: R-ST-1, R-ST-2
    And the provisioner stays in phase "<phase>" during the observation window

    Examples:
      | replicas | phase   | status | reason               |
      | 0        | Pending | False  | NoReplicasReady      |
      | 2        | Ready   | True   | MinimumReplicasReady |

  # The status says what the Deployment reports, whoever wrote it last: an operator that
  # ignores status events leaves a stale write standing until its next resync.
  @R-ST-2 @R-ST-3 @D-10 @extended
  Scenario: A status another client overwrote is corrected
    Given the sample provisioner is Ready
    When another client writes the provisioner's status:
      """
      phase: Pending
      readyReplicas: 0
      """
    # checks: R-ST-2, R-ST-3, D-10
    Then the provisioner status has:
      | field         | value |
      | phase         | Ready |
      | readyReplicas | 1     |

  # A pod quota lets the ReplicaSet controller start one pod of three (on the local tier the
  # readiness stand-in honours the quota the same way, D-8).
  @R-ST-1 @R-ST-2 @R-ST-3 @R-ST-5 @core
  Scenario: One ready replica of three makes the provisioner Ready
    Given the namespace allows only 1 pod
    When the sample provisioner is applied with spec:
      """
      replicas: 3
      """
    # checks: R-ST-3
    Then the provisioner status has:
      | field         | value |
      | readyReplicas | 1     |
    # checks: R-ST-2
    And the provisioner status has:
      | field | value |
      | phase | Ready |
    # checks: R-ST-5
    And the provisioner has condition "DeploymentReady" "True" with reason "MinimumReplicasReady"
    # checks: R-ST-1, R-ST-2
    And the provisioner stays in phase "Ready" during the observation window

  @R-ST-3 @core
  Scenario: The status counts the Deployment's ready replicas
    When the sample provisioner is applied with spec:
      """
      replicas: 2
      """
    Then the provisioner status has:
      | field         | value |
      | readyReplicas | 2     |

  @R-POD-2 @R-POD-7 @R-POD-15 @extended
  Scenario: One container, selected by the standard labels, and no tag flags for the daemon
    When the sample provisioner is applied with spec:
      """
      tags: {scope: organization, owner: conformance}
      """
    # checks: R-POD-2
    Then the provisioner Deployment selects its pods by exactly the standard labels
    # checks: R-POD-7
    And the provisioner pod template has exactly one container, named "provisioner"
    # checks: R-POD-15
    And the provisioner container has no env var "CODER_PROVISIONERD_TAGS"
    # checks: R-POD-15
    And the provisioner container's args are '["provisioner", "start"]'

  @R-RES-2 @R-RES-4 @R-CRD-13 @D-4 @D-6 @extended
  Scenario: Provisioners with long names get distinct children with names of at most 63 characters
    When a second provisioner "a-provisioner-with-a-name-long-enough-to-need-shortening-number-one" is applied with spec:
      """
      {}
      """
    And a second provisioner "a-provisioner-with-a-name-long-enough-to-need-shortening-number-two" is applied with spec:
      """
      {}
      """
    # A long name must not stop any part: the key's name, the children's names or their labels.
    # checks: R-CRD-13, D-4, R-RES-2, R-RES-4, D-6
    Then the provisioner "a-provisioner-with-a-name-long-enough-to-need-shortening-number-one" has condition "DeploymentReady" "True" with reason "MinimumReplicasReady"
    # checks: R-CRD-13, D-4, R-RES-2, R-RES-4, D-6
    And the provisioner "a-provisioner-with-a-name-long-enough-to-need-shortening-number-two" has condition "DeploymentReady" "True" with reason "MinimumReplicasReady"
    # checks: R-RES-2, R-RES-4, D-6
    And the children of the two provisioners have distinct names and labels of at most 63 characters

  # At the limit itself: 51 characters give children of exactly 63, kept whole (R-RES-1). One more
  # character must be shortened; how is the implementation's own (D-6: at most 63 characters,
  # deterministic, distinct), which the scenario above and the end-of-scenario oracle check.
  @R-RES-1 @R-RES-2 @extended
  Scenario: A provisioner name of 51 characters gives children named in full
    When the sample provisioner is applied under the name "provisioner-name-of-fifty-one-characters-kept-as-is"
    # checks: R-RES-1, R-RES-2
    Then these objects exist, controlled by the provisioner:
      | kind           | name                                                            |
      | Deployment     | provisioner-provisioner-name-of-fifty-one-characters-kept-as-is |
      | Role           | provisioner-provisioner-name-of-fifty-one-characters-kept-as-is |
      | RoleBinding    | provisioner-provisioner-name-of-fifty-one-characters-kept-as-is |
      | ServiceAccount | provisioner-name-of-fifty-one-characters-kept-as-is-provisioner |

  @R-RES-5 @R-W-2 @extended
  Scenario Outline: A manual edit of the <kind> is reverted
    Given the sample provisioner is Ready
    When the <kind> "provisioner-{provisioner}" is changed to:
      """
      <edit>
      """
    # checks: R-RES-5, R-W-2
    Then the <kind> "provisioner-{provisioner}" has at "<path>":
      """
      <value>
      """

    Examples:
      | kind       | edit                                                              | path           | value                                                                                                              |
      | Deployment | {spec: {replicas: 5}}                                             | /spec/replicas | 1                                                                                                                  |
      | Role       | {rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]}     | /rules         | [{apiGroups: [""], resources: [pods, persistentvolumeclaims], verbs: [get, list, watch, create, update, patch, delete]}] |
