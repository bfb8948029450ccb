@fake-coderd
Feature: Prerequisites on the referenced control plane
  A CoderProvisioner uses the CoderControlPlane named by spec.controlPlaneRef in its namespace:
  its status.url, and its operator access (status.operatorAccessReady and the token Secret named
  by status.operatorTokenSecretRef). Until those are usable, nothing is created anywhere.

  @R-PRE-1 @R-DEL-1 @core
  Scenario: The operator puts the key-cleanup finalizer on a new provisioner
    Given a Ready control plane with operator access
    When the sample provisioner is applied
    # checks: R-PRE-1, R-DEL-1
    Then the provisioner carries the finalizer "coder.com/provisioner-key-cleanup"

  @R-PRE-2 @core
  Scenario: A provisioner whose control plane does not exist waits
    Given no control plane exists
    When the sample provisioner is applied
    Then the provisioner has condition "ControlPlaneReady" "False" with reason "ControlPlaneUnavailable"
    And no child object of the provisioner exists during the observation window

  @R-PRE-3 @core
  Scenario: A control plane without a URL is unavailable
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      url: null
      """
    When the sample provisioner is applied
    Then the provisioner has condition "ControlPlaneReady" "False" with reason "ControlPlaneUnavailable"
    And coderd saw no requests

  @R-PRE-4 @core
  Scenario: The control plane's phase is not a gate
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      phase: Pending
      """
    When the sample provisioner is applied
    Then the provisioner becomes Ready

  @R-PRE-5 @core
  Scenario Outline: Operator access that is <state> blocks the provisioner
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      operatorAccessReady: <value>
      """
    When the sample provisioner is applied
    Then the provisioner has condition "OperatorAccessReady" "False" with reason "OperatorAccessNotReady"
    And the OperatorAccessReady condition's message mentions "status.operatorAccessReady=true"
    And coderd saw no requests
    And no child object of the provisioner exists during the observation window

    Examples:
      | state     | value |
      | not ready | false |
      | unknown   | null  |

  @R-PRE-12 @D-1 @core
  Scenario: A failing gate leaves the later conditions unset on a new provisioner
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      operatorAccessReady: false
      """
    When the sample provisioner is applied
    # checks: D-1
    Then the provisioner has condition "OperatorAccessReady" "False" with reason "OperatorAccessNotReady"
    And the provisioner has no condition "ExternalProvisionersEntitled"
    And the provisioner has no condition "ProvisionerKeyReady"
    And the provisioner has no condition "DeploymentReady"

  @R-PRE-6 @core
  Scenario: A control plane without an operator token reference blocks the provisioner
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      operatorTokenSecretRef: null
      """
    When the sample provisioner is applied
    Then the provisioner has condition "OperatorAccessReady" "False" with reason "OperatorTokenSecretRefMissing"
    And coderd saw no requests

  @R-PRE-7 @core
  Scenario: An operator token reference without a name blocks the provisioner
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      operatorTokenSecretRef:
        name: ""
      """
    When the sample provisioner is applied
    Then the provisioner has condition "OperatorAccessReady" "False" with reason "OperatorTokenSecretRefInvalid"
    And coderd saw no requests

  @R-PRE-9 @core
  Scenario: A missing operator token Secret blocks the provisioner
    Given a Ready control plane with operator access
    And the operator token Secret does not exist
    When the sample provisioner is applied
    Then the provisioner has condition "OperatorAccessReady" "False" with reason "OperatorTokenSecretUnavailable"

  @R-PRE-9 @core
  Scenario Outline: An operator token Secret with <shape> token blocks the provisioner
    Given a Ready control plane with operator access
    And the operator token Secret holds <shape> token
    When the sample provisioner is applied
    Then the provisioner has condition "OperatorAccessReady" "False" with reason "OperatorTokenSecretUnavailable"
    And coderd saw no requests

    Examples:
      | shape    |
      | no       |
      | an-empty |

  @R-PRE-8 @R-PRE-10 @R-PRE-11 @core
  Scenario Outline: With <data key> in the reference the token is read from "token"
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      operatorTokenSecretRef:
        key: <value>
      """
    When the sample provisioner is applied
    # checks: R-PRE-11
    Then the provisioner has condition "ControlPlaneReady" "True" with reason "ControlPlaneAvailable"
    # checks: R-PRE-8, R-PRE-11
    And the provisioner has condition "OperatorAccessReady" "True" with reason "OperatorAccessReady"
    # checks: R-PRE-8
    And the provisioner becomes Ready
    # checks: R-PRE-8, R-PRE-10
    And every provisioner key request carried the operator token

    Examples:
      | data key          | value |
      | no data key       | null  |
      | an empty data key | ""    |

  # D-10: the change of the control plane is seen promptly (a watch), not at the next requeue.
  @R-W-1 @D-10 @extended
  Scenario: The provisioner proceeds once operator access becomes ready
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      operatorAccessReady: false
      """
    When the sample provisioner is applied
    # checks: none
    Then the provisioner has condition "OperatorAccessReady" "False" with reason "OperatorAccessNotReady"
    When the control plane status is changed to:
      """
      operatorAccessReady: true
      """
    # checks: R-W-1, D-10
    Then the provisioner becomes Ready
