@fake-coderd @entitlement
Feature: The external provisioner entitlement
  External provisioners need the Coder license entitlement "external_provisioner_daemons".
  The operator trusts the control plane's recent check (less than two minutes old) and asks
  coderd otherwise; without the entitlement it creates no key and no Deployment.

  @R-ENT-1 @R-ENT-4 @tutorial @core
  Scenario: A recent "entitled" check on the control plane is trusted
    Given a Ready control plane with operator access
    When the sample provisioner is applied
    # checks: R-ENT-1, R-ENT-4
    Then the provisioner has condition "ExternalProvisionersEntitled" "True" with reason "Entitled"
    # checks: R-ENT-1
    And coderd saw no GET on "entitlements"

  @R-ENT-1 @tutorial @core
  Scenario: A recent "grace_period" check on the control plane is trusted
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      externalProvisionerDaemonsEntitlement: grace_period
      """
    When the sample provisioner is applied
    Then the provisioner has condition "ExternalProvisionersEntitled" "True" with reason "Entitled"
    And the provisioner becomes Ready

  @R-ENT-2 @R-ENT-9 @tutorial @core
  Scenario: A recent "not_entitled" check blocks the provisioner without asking coderd
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      externalProvisionerDaemonsEntitlement: not_entitled
      """
    When the sample provisioner is applied
    # checks: R-ENT-2
    Then the provisioner has condition "ExternalProvisionersEntitled" "False" with reason "NotEntitled"
    # checks: R-ENT-2, R-ENT-9
    And coderd saw no requests
    # checks: R-ENT-2
    And no child object of the provisioner exists during the observation window

  # A stale check is not trusted whatever it said: coderd's answer (entitled) decides.
  @R-ENT-3 @R-ENT-4 @core
  Scenario Outline: A stale "<value>" check makes the operator ask coderd
    Given a Ready control plane with operator access
    And the control plane's "<value>" entitlement check is older than two minutes
    When the sample provisioner is applied
    # checks: R-ENT-3, R-ENT-4
    Then the provisioner has condition "ExternalProvisionersEntitled" "True" with reason "Entitled"
    # checks: R-ENT-3
    And coderd saw at least 1 GET on "entitlements"
    # checks: R-ENT-3, R-ENT-4
    And the provisioner becomes Ready

    Examples:
      | value        |
      | unknown      |
      | not_entitled |
      | entitled     |

  @R-ENT-5 @R-ENT-9 @core
  Scenario: coderd reporting "not_entitled" blocks the provisioner
    Given a Ready control plane with operator access
    And the control plane's entitlement check is older than two minutes
    And coderd reports the external provisioner entitlement as "not_entitled"
    When the sample provisioner is applied
    # checks: R-ENT-5
    Then the provisioner has condition "ExternalProvisionersEntitled" "False" with reason "NotEntitled"
    # checks: R-ENT-5, R-ENT-9
    And coderd saw no provisioner key requests
    # checks: R-ENT-5
    And no child object of the provisioner exists during the observation window

  @R-ENT-5 @core
  Scenario: coderd omitting the feature counts as not entitled
    Given a Ready control plane with operator access
    And the control plane's entitlement check is older than two minutes
    And coderd reports the external provisioner entitlement as "absent"
    When the sample provisioner is applied
    Then the provisioner has condition "ExternalProvisionersEntitled" "False" with reason "NotEntitled"
    And coderd saw no provisioner key requests

  @R-ENT-6 @R-ENT-7 @R-ENT-8 @R-ENT-9 @fault-injection @extended
  Scenario Outline: An entitlements answer of <status> gives the reason <reason>
    Given a Ready control plane with operator access
    And the control plane's entitlement check is older than two minutes
    And coderd answers every GET on "entitlements" with status <status>
    When the sample provisioner is applied
    # checks: R-ENT-6, R-ENT-7, R-ENT-8
    Then the provisioner has condition "ExternalProvisionersEntitled" "False" with reason "<reason>"
    # checks: R-ENT-9
    And coderd saw no provisioner key requests

    Examples:
      | status | reason                  |
      | 404    | NotSupported            |
      | 401    | Forbidden               |
      | 403    | Forbidden               |
      | 429    | EntitlementsQueryFailed |
      | 500    | EntitlementsQueryFailed |
      | 502    | EntitlementsQueryFailed |
      | 503    | EntitlementsQueryFailed |

  @R-ENT-4 @core
  Scenario: coderd reporting "grace_period" lets the provisioner proceed
    Given a Ready control plane with operator access
    And the control plane's entitlement check is older than two minutes
    And coderd reports the external provisioner entitlement as "grace_period"
    When the sample provisioner is applied
    Then the provisioner has condition "ExternalProvisionersEntitled" "True" with reason "Entitled"
    And the provisioner becomes Ready

  @R-ENT-3 @core
  Scenario: A recent check with a value other than entitled, grace_period or not_entitled makes the operator ask coderd
    Given a Ready control plane with operator access
    And the control plane status is changed to:
      """
      externalProvisionerDaemonsEntitlement: unknown
      """
    When the sample provisioner is applied
    Then the provisioner has condition "ExternalProvisionersEntitled" "True" with reason "Entitled"
    And coderd saw at least 1 GET on "entitlements"
    And the provisioner becomes Ready
