@fake-coderd
Feature: The provisioner key Secret
  The operator creates the key Secret and owns it. A Secret of that name that it does not own
  is refused (KeySecretNotOwned) and left alone; the operator proceeds once it is gone.

  @R-SEC-1 @R-SEC-2 @R-SEC-3 @R-SEC-4 @R-SEC-7 @core
  Scenario: The operator creates and owns the key Secret
    Given a Ready control plane with operator access
    When the sample provisioner is applied
    # checks: R-SEC-7
    Then the provisioner has condition "ProvisionerKeySecretReady" "True" with reason "SecretReady"
    # checks: R-SEC-1, R-SEC-3, R-SEC-4
    And these objects exist, controlled by the provisioner:
      | kind   | name                           |
      | Secret | {provisioner}-provisioner-key |
    # checks: R-SEC-1, R-SEC-2
    And the Secret "{provisioner}-provisioner-key" holds a provisioner key

  @R-SEC-8 @R-SEC-9 @R-SEC-10 @R-SEC-11 @R-SEC-15 @D-3 @tutorial @core
  Scenario: A Secret the provisioner does not own is refused and left unchanged
    Given a Ready control plane with operator access
    And a Secret "taken-key" that the provisioner does not own
    When the sample provisioner is applied with spec:
      """
      key:
        secretName: taken-key
      """
    # checks: R-SEC-8, R-SEC-9, D-3
    Then the provisioner has condition "ProvisionerKeySecretReady" "False" with reason "KeySecretNotOwned"
    # checks: R-SEC-10, D-3
    And the Secret "taken-key" is left unchanged
    # checks: R-SEC-15
    And no Secret the suite wrote was written by anyone else
    # checks: R-SEC-11, D-3
    And coderd saw no provisioner key requests
    # checks: R-SEC-11
    And no child object of the provisioner exists during the observation window

  # One kind of owner is not enough: an operator that checks only "has an owner reference to me"
  # adopts a Secret it merely appears in, and one that checks "has a controller" is fooled by any.
  @R-SEC-8 @R-SEC-10 @R-SEC-11 @R-SEC-15 @core
  Scenario Outline: A key Secret owned <owner> is refused and left unchanged
    Given a Ready control plane with operator access
    When the sample provisioner is applied with spec:
      """
      controlPlaneRef: {name: not-yet}
      """
    # checks: none
    Then the provisioner has condition "ControlPlaneReady" "False" with reason "ControlPlaneUnavailable"
    When a Secret "{provisioner}-provisioner-key" owned "<owner>" is created
    And the provisioner spec is changed to:
      """
      controlPlaneRef: {name: codercontrolplane-sample}
      """
    # checks: R-SEC-8
    Then the provisioner has condition "ProvisionerKeySecretReady" "False" with reason "KeySecretNotOwned"
    # checks: R-SEC-10
    And the Secret "{provisioner}-provisioner-key" is left unchanged
    # checks: R-SEC-15
    And no Secret the suite wrote was written by anyone else
    # checks: R-SEC-11
    And coderd saw no provisioner key requests

    Examples:
      | owner                                           |
      | by nobody                                       |
      | by the provisioner without being its controller |
      | by a ConfigMap as its controller                |

  @R-SEC-12 @core
  Scenario: A key Secret controlled by another provisioner is refused
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    Then the Secret "{provisioner}-provisioner-key" holds a provisioner key
    When a second provisioner "second-provisioner" is applied with spec:
      """
      key:
        secretName: {provisioner}-provisioner-key
      """
    Then the provisioner "second-provisioner" has condition "ProvisionerKeySecretReady" "False" with reason "KeySecretNotOwned"
    And the Secret "{provisioner}-provisioner-key" keeps its provisioner key
    And coderd saw exactly 1 POST on "provisionerkeys"
    And the provisioner is still Ready

  @R-SEC-13 @D-3 @slow @core
  Scenario: The provisioner proceeds once the refused Secret is gone
    Given a Ready control plane with operator access
    And a Secret "taken-key" that the provisioner does not own
    When the sample provisioner is applied with spec:
      """
      key:
        secretName: taken-key
      """
    # checks: D-3
    Then the provisioner has condition "ProvisionerKeySecretReady" "False" with reason "KeySecretNotOwned"
    When the Secret "taken-key" is deleted
    # checks: R-SEC-13, D-3
    Then the provisioner becomes Ready within 90 seconds
    # checks: R-SEC-13
    And the Secret "taken-key" holds a provisioner key
    # checks: R-SEC-13
    And coderd saw exactly 1 POST on "provisionerkeys"

  # A key whose Secret cannot be written exists only in coderd: it is deleted again in the same
  # pass, so retries neither pile keys up nor meet their own leftovers (409) and replace them.
  @R-KEY-18 @R-KEY-8 @extended
  Scenario: A key whose Secret is refused is deleted again, and retries leave nothing behind
    Given a Ready control plane with operator access
    And the namespace refuses new Secrets
    When the sample provisioner is applied
    # checks: R-KEY-18
    Then the provisioner has condition "ProvisionerKeyReady" "False" with reason "ProvisionerKeyFailed"
    # checks: R-KEY-8
    And coderd holds exactly 0 provisioner key named "coderprovisioner-sample"
    When the namespace accepts new Secrets again
    # checks: none
    Then the provisioner becomes Ready
    # checks: R-KEY-8
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"
    # checks: none
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: R-KEY-8
    And coderd answered no POST on "provisionerkeys" with status 409

  # The key Secret is tried first (a server-side dry-run): a Secret the API server refuses costs
  # coderd nothing, however often the pass is retried, instead of a create and a delete each time.
  @R-KEY-18 @R-KEY-8 @extended
  Scenario: No key is created while the key Secret would be refused
    Given a Ready control plane with operator access
    And the namespace refuses new Secrets
    When the sample provisioner is applied
    # checks: R-KEY-18
    Then the provisioner has condition "ProvisionerKeyReady" "False" with reason "ProvisionerKeyFailed"
    # checks: R-KEY-8
    And coderd saw no POST on "provisionerkeys"
    # checks: R-KEY-8
    And coderd saw no DELETE on "provisionerkey"
