@fake-coderd
Feature: Clean-up when a provisioner is deleted
  The operator deletes the key this provisioner created, found by status.organizationID and
  status.provisionerKeyID, not by the names in the spec. The clean-up is best-effort: when
  coderd cannot be reached or the delete fails, the finalizer is still removed and the key
  stays valid in coderd.

  Background:
    Given a Ready control plane with operator access

  @R-DEL-2 @R-DEL-4 @R-DEL-12 @tutorial @core
  Scenario: Deleting the provisioner deletes its key in coderd
    Given the sample provisioner is Ready
    # checks: none
    Then the provisioner status records its provisioner key
    When the provisioner is deleted
    # checks: R-DEL-2, R-DEL-12
    Then the provisioner is gone
    # checks: R-DEL-2, R-DEL-4
    And the recorded provisioner key no longer exists in coderd
    # checks: R-DEL-2, R-DEL-4
    And coderd saw exactly 1 DELETE on "provisionerkey"
    # checks: R-DEL-12
    And the provisioner's children are removed by garbage collection

  @R-DEL-3 @R-DEL-10 @tutorial @core
  Scenario Outline: The key is found by its recorded ids, not by the spec's <field>
    Given a provisioner key named "someone-elses-key" already exists in the scenario's organization
    And the scenario has a second coderd organization
    And a provisioner key named "coderprovisioner-sample" already exists in the second organization
    And the sample provisioner is Ready
    # checks: none
    Then the provisioner status records its provisioner key
    When the control plane status is changed to:
      """
      externalProvisionerDaemonsEntitlement: not_entitled
      """
    # checks: none
    Then the provisioner has condition "ExternalProvisionersEntitled" "False" with reason "NotEntitled"
    When the provisioner spec is changed to:
      """
      <spec>
      """
    And the provisioner is deleted
    # checks: R-DEL-10
    Then the provisioner is gone
    # checks: R-DEL-3, R-DEL-10
    And the recorded provisioner key no longer exists in coderd
    # checks: R-DEL-3
    And coderd saw exactly 1 DELETE on "provisionerkey"
    # checks: R-DEL-3
    And coderd holds exactly 1 provisioner key named "someone-elses-key"
    # checks: R-DEL-3
    And the second organization holds exactly 1 provisioner key named "coderprovisioner-sample"

    Examples:
      | field        | spec                                                                                  |
      | key name     | key: {name: someone-elses-key}                                                        |
      | organization | organizationName: "{second organization}"                                             |
      | tags         | tags: {team: red}                                                                     |
      | Secret       | key: {secretName: another-secret, secretKey: another-key}                             |
      | every field  | {key: {name: someone-elses-key}, organizationName: "{second organization}", tags: {team: red}} |
      | control plane | controlPlaneRef: {name: no-such-control-plane}                                        |

  @R-DEL-3 @R-DEL-4 @D-5 @core
  Scenario: A key replaced under the recorded name by someone else is not deleted
    Given the sample provisioner is Ready
    # checks: none
    Then the provisioner status records its provisioner key
    When the recorded provisioner key is replaced in coderd by someone else's key of the same name
    And the provisioner is deleted
    # checks: R-DEL-4
    Then the provisioner is gone
    # checks: R-DEL-3, R-DEL-4, D-5
    And coderd saw no DELETE on "provisionerkey"
    # checks: R-DEL-3, D-5
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"

  @R-DEL-2 @fault-injection @core
  Scenario: The finalizer stays until coderd has answered the key delete
    Given the sample provisioner is Ready
    Then the provisioner status records its provisioner key
    When coderd delays its answers to every DELETE on "provisionerkey" by 4 seconds
    And the provisioner is deleted
    Then while coderd holds back the DELETE answer the provisioner keeps the finalizer "coder.com/provisioner-key-cleanup"
    And the provisioner is gone
    And the recorded provisioner key no longer exists in coderd
    And coderd saw exactly 1 DELETE on "provisionerkey"

  # A key whose id request (D-12: a lookup with the key itself, or a listing of the organization's
  # keys) met a 429 and then a 503 is stored and recorded by name, its id not yet known. Deleted
  # then, the provisioner must not leave that stored key valid in coderd.
  @R-KEY-25 @fault-injection @extended
  Scenario Outline: A provisioner deleted while its stored key's <id request> fails leaves no key in coderd
    Given coderd answers the next GET on "<route>" after a key create with status 429
    And coderd answers the next GET on "<route>" after a key create with status 503
    When the sample provisioner is applied
    # checks: none
    Then the operator learns its new key's id <way>, or this scenario does not apply (D-12)
    # checks: none
    And coderd answered a GET on "<route>" with status 503
    When the provisioner is deleted
    # checks: none
    Then the provisioner is gone
    # checks: R-KEY-25
    And coderd holds exactly 0 provisioner key named "coderprovisioner-sample"

    Examples:
      | id request | route           | way                                |
      | lookup     | daemon-key      | with the key itself                |
      | listing    | provisionerkeys | by listing the organization's keys |

  @R-DEL-5 @tutorial @core
  Scenario: A provisioner without a recorded key is removed without calling coderd
    Given the control plane status is changed to:
      """
      externalProvisionerDaemonsEntitlement: not_entitled
      """
    When the sample provisioner is applied
    Then the provisioner has condition "ExternalProvisionersEntitled" "False" with reason "NotEntitled"
    And the provisioner carries the finalizer "coder.com/provisioner-key-cleanup"
    When the provisioner is deleted
    Then the provisioner is gone
    And coderd saw no requests

  @R-DEL-6 @tutorial @core
  Scenario: Without its control plane the provisioner is removed and the key stays
    Given the sample provisioner is Ready
    Then the provisioner status records its provisioner key
    When the control plane is deleted
    And the provisioner is deleted
    Then the provisioner is gone
    And the recorded provisioner key still exists in coderd
    And coderd saw no DELETE on "provisionerkey"

  @R-DEL-7 @tutorial @core
  Scenario: Without the operator token the provisioner is removed and the key stays
    Given the sample provisioner is Ready
    Then the provisioner status records its provisioner key
    When the operator token Secret is deleted
    And the provisioner is deleted
    Then the provisioner is gone
    And the recorded provisioner key still exists in coderd
    And coderd saw no DELETE on "provisionerkey"

  # The token Secret is still there and still valid: the control plane's status alone says the
  # operator may not use it.
  @R-DEL-7 @core
  Scenario Outline: With <shape> the provisioner is removed and the key stays
    Given the sample provisioner is Ready
    Then the provisioner status records its provisioner key
    When the control plane status is changed to:
      """
      <status>
      """
    And the provisioner is deleted
    Then the provisioner is gone
    And the recorded provisioner key still exists in coderd
    And coderd saw no DELETE on "provisionerkey"

    Examples:
      | shape                       | status                       |
      | operator access not ready   | operatorAccessReady: false   |
      | no operator token reference | operatorTokenSecretRef: null |

  @R-DEL-8 @tutorial @serial @fault-injection @core
  Scenario: When coderd is unreachable the provisioner is removed and the key stays
    Given the sample provisioner is Ready
    Then the provisioner status records its provisioner key
    When coderd becomes unreachable
    And the provisioner is deleted
    Then the provisioner is gone
    When coderd becomes reachable again
    Then the recorded provisioner key still exists in coderd

  # Every failure the rule names, 429 included: on deletion a rate limit is not retried.
  @R-DEL-8 @tutorial @fault-injection @core
  Scenario Outline: When the delete call fails with <status> the provisioner is removed after one attempt
    Given the sample provisioner is Ready
    Then the provisioner status records its provisioner key
    When coderd answers every DELETE on "provisionerkey" with status <status>
    And the provisioner is deleted
    Then the provisioner is gone
    And the recorded provisioner key still exists in coderd
    And coderd saw exactly 1 DELETE on "provisionerkey"

    Examples:
      | status |
      | 500    |
      | 503    |
      | 401    |
      | 403    |
      | 429    |

  @R-DEL-9 @fault-injection @core
  Scenario: A key already gone from coderd does not hold up the deletion
    Given the sample provisioner is Ready
    Then the provisioner status records its provisioner key
    When coderd answers every DELETE on "provisionerkey" with status 404
    And the provisioner is deleted
    Then the provisioner is gone
    And coderd saw exactly 1 DELETE on "provisionerkey"

  @R-DEL-11 @serial @operator-restart @core
  Scenario: A provisioner deleted before the operator added its finalizer is left alone
    Given the operator is stopped
    And the sample provisioner is applied with the finalizer "conformance.coder.com/hold"
    When the provisioner is deleted
    And the operator is started
    Then coderd sees no requests since the last action during the observation window
    And no child object of the provisioner exists during the observation window
    And the provisioner keeps only the finalizer "conformance.coder.com/hold" during the observation window
    When the finalizer "conformance.coder.com/hold" is removed from the provisioner
    Then the provisioner is gone
