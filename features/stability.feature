@fake-coderd
Feature: No churn against coderd
  The PR's second bug: when a later step failed, every retry went back to coderd to validate
  or rotate the key, until coderd rate-limited the operator. A provisioner whose key is in
  place makes no key request, whatever happens after it and however often it is reconciled.

  @R-KEY-7 @R-KEY-8 @PR @slow @core
  Scenario: Retries after a refused Role make no further key requests
    Given a Ready control plane with operator access
    And the namespace refuses new Roles
    When the sample provisioner is applied
    # checks: R-KEY-7
    Then the provisioner status records its provisioner key
    # checks: R-KEY-8
    And coderd saw exactly 1 POST on "provisionerkeys"
    # checks: R-KEY-8
    And coderd sees no provisioner key requests from now on during the observation window
    When the provisioner and its control plane receive unrelated updates
    # checks: R-KEY-8
    Then coderd sees no provisioner key requests since the last action during the observation window
    # checks: none
    And no Deployment named "provisioner-{provisioner}" exists during the observation window
    When the namespace accepts new Roles again
    # checks: none
    Then the provisioner becomes Ready
    # checks: R-KEY-8
    And coderd saw exactly 1 POST on "provisionerkeys"
    # checks: R-KEY-8
    And coderd saw no DELETE on "provisionerkey"

  @R-KEY-4 @R-KEY-9 @R-SEC-5 @PR @core
  Scenario: A steady provisioner makes no coderd requests
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    # checks: none
    Then the Secret "{provisioner}-provisioner-key" holds a provisioner key
    When the provisioner and its control plane receive unrelated updates
    # checks: R-KEY-4, R-KEY-9
    Then coderd sees no requests since the last action during the observation window
    # checks: R-SEC-5
    And the Secret "{provisioner}-provisioner-key" keeps its provisioner key
    # checks: none
    And the provisioner is still Ready

  @R-ST-7 @extended
  Scenario: A steady provisioner does not rewrite its status
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    When the provisioner and its control plane receive unrelated updates
    Then the provisioner's status is not written again during the observation window

  @R-KEY-4 @PR @serial @operator-restart @core
  Scenario: A restarted operator makes no key requests
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    Then the Secret "{provisioner}-provisioner-key" holds a provisioner key
    When the operator is restarted
    Then coderd sees no provisioner key requests since the last action during the observation window
    And the Secret "{provisioner}-provisioner-key" keeps its provisioner key
    And the provisioner is still Ready
    And coderd saw exactly 1 POST on "provisionerkeys"

  # The operator decides from the API server's copy of the CR and writes its status on the
  # condition that nobody wrote since: other writers on the CR during its creation (label and
  # annotation controllers) must cost no second key.
  @R-KEY-4 @core
  Scenario: Other writers on the provisioner during its creation cost no extra key
    Given a Ready control plane with operator access
    When the sample provisioner is applied while someone keeps annotating it
    Then the provisioner becomes Ready
    And coderd saw exactly 1 POST on "provisionerkeys"
    And coderd saw no DELETE on "provisionerkey"
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"

  # Label and annotation controllers rewrite CRs' metadata all day. A pass costs the operator
  # several API requests, so one that starts a pass for each such edit spends its time on them
  # and a spec change waits behind them (measured on an earlier operator: at 123 metadata writes
  # a second over 50 CRs, spec changes took up to 9 minutes to apply).
  @R-W-4 @api-audit @operator-identity @extended
  Scenario: Other writers' metadata edits start no work, and a spec change still applies under them
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    When someone keeps annotating the provisioner
    Then the operator makes at most 25 API requests in the namespace while the provisioner is annotated 100 more times
    When the provisioner spec is changed to:
      """
      image: example.com/coder:v2.31.0
      """
    Then the provisioner container's image is "example.com/coder:v2.31.0"

  # R-KEY-7 is about order: a key recorded after the ServiceAccount is still visible when a later
  # step fails, so only the API server's own record of the writes tells the two apart. Only the
  # local tier has that record: the scenario is Extended so that a cluster run can claim Core
  # (R-KEY-7's Core scenario is the refused Role's, above).
  @R-KEY-7 @api-audit @operator-identity @extended
  Scenario: The key is recorded in status before the provisioner's other children are written
    Given a Ready control plane with operator access
    When the sample provisioner is applied
    # checks: none
    Then the provisioner becomes Ready
    # checks: R-KEY-7
    And the operator wrote the provisioner's status after its key Secret and before its other children
