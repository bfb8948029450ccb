@fake-coderd
Feature: The provisioner key in coderd
  The operator creates one provisioner key per CoderProvisioner in coderd, stores its plaintext
  in the key Secret, records it in the status, and replaces it only when it must: the Secret is
  lost, or the settings the key was made with changed.

  @R-KEY-1 @R-KEY-2 @R-KEY-3 @R-KEY-5 @R-KEY-6 @R-KEY-20 @R-KEY-25 @core
  Scenario: The first reconcile creates exactly one key and stores it
    Given a Ready control plane with operator access
    When the sample provisioner is applied
    # checks: none
    Then the provisioner becomes Ready
    # checks: R-KEY-20
    And the provisioner has condition "ProvisionerKeyReady" "True" with reason "ProvisionerKeyReady"
    # checks: R-KEY-3
    And coderd saw exactly 1 POST on "provisionerkeys"
    # checks: R-KEY-3
    And coderd saw no DELETE on "provisionerkey"
    # checks: R-KEY-2, R-KEY-3
    And coderd holds a provisioner key named "coderprovisioner-sample" with tags:
      | tag   | value        |
      | scope | organization |
    # checks: R-KEY-5
    And the key in Secret "coderprovisioner-sample-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: R-KEY-1, R-KEY-6
    And the provisioner status has:
      | field               | value                                   |
      | organizationName    | {organization}                          |
      | organizationID      | {organization id}                       |
      | provisionerKeyName  | coderprovisioner-sample                 |
      | controlPlaneRefName | codercontrolplane-sample                |
      | controlPlaneURL     | {url}                                   |
      | secretRef.name      | coderprovisioner-sample-provisioner-key |
      | secretRef.key       | key                                     |
    # checks: R-KEY-25
    And coderd holds no key of the scenario's organizations that no provisioner records

  # No tag is added on the way to coderd (a default scope, say), and no tags hash to 811c9dc5.
  @R-KEY-3 @R-ST-8 @core
  Scenario: A provisioner without tags creates its key with none
    Given a Ready control plane with operator access
    When the sample provisioner is applied with spec:
      """
      tags: null
      """
    # checks: none
    Then the provisioner becomes Ready
    # checks: R-KEY-3
    And coderd holds a provisioner key named "coderprovisioner-sample" with tags:
      | tag | value |
    # checks: R-ST-8
    And the provisioner status has:
      | field    | value    |
      | tagsHash | 811c9dc5 |

  # The default organization is shared by the scenarios, so the key is named after the
  # scenario's own organization to keep it apart from theirs.
  @R-KEY-1 @R-CRD-5 @extended
  Scenario Outline: An organizationName <given> puts the key in the default organization
    Given a Ready control plane with operator access
    When the sample provisioner is applied with spec:
      """
      organizationName: <value>
      key: {name: "{organization}"}
      """
    # checks: R-KEY-1, R-CRD-5
    Then the provisioner becomes Ready
    # checks: R-KEY-1, R-CRD-5
    And the provisioner status has:
      | field            | value                     |
      | organizationName | default                   |
      | organizationID   | {default organization id} |
    # checks: R-KEY-1, R-CRD-5
    And coderd holds exactly 1 provisioner key named "{organization}" in the default organization

    Examples:
      | given     | value   |
      | left out  | null    |
      | empty     | ""      |
      | "default" | default |

  @R-KEY-10 @D-5 @core
  Scenario Outline: A key Secret <loss> replaces the key once
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    # checks: none
    Then the provisioner status records its provisioner key
    # checks: none
    And the Secret "{provisioner}-provisioner-key" holds a provisioner key
    # checks: none
    And the provisioner pod template is remembered
    When the provisioner key Secret is <loss>
    # checks: R-KEY-10
    Then the Secret "{provisioner}-provisioner-key" gets a new provisioner key
    # checks: R-KEY-10, D-5
    And the recorded provisioner key no longer exists in coderd
    # checks: R-KEY-10
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"
    # checks: R-KEY-10
    And coderd saw exactly 2 POST on "provisionerkeys"
    # checks: R-KEY-10, D-5
    And coderd saw exactly 1 DELETE on "provisionerkey"
    # checks: R-KEY-10
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: R-KEY-10
    And the provisioner pod template changes
    # checks: none
    And the provisioner becomes Ready

    Examples:
      | loss    |
      | deleted |
      | emptied |

  @R-KEY-13 @R-KEY-14 @R-KEY-15 @R-KEY-17 @R-ST-8 @R-POD-3 @extended
  Scenario Outline: Changing <change> after Ready replaces the key
    Given a Ready control plane with operator access
    And the scenario has a second coderd organization
    And the sample provisioner is applied with spec:
      """
      tags: {scope: organization, team: blue}
      """
    # checks: none
    Then the provisioner becomes Ready
    # checks: none
    And the provisioner status records its provisioner key
    # checks: R-ST-8
    And the provisioner status has:
      | field    | value    |
      | tagsHash | 58d21dbb |
    # checks: none
    And the provisioner pod template is remembered
    When the provisioner spec is changed to:
      """
      <spec>
      """
    # checks: R-KEY-13, R-KEY-14, R-KEY-15, R-ST-8
    Then the provisioner status has:
      | field              | value          |
      | provisionerKeyName | <key name>     |
      | organizationName   | <organization> |
      | tagsHash           | <tags hash>    |
    # checks: R-KEY-13, R-KEY-14, R-KEY-15, R-KEY-17
    And the recorded provisioner key no longer exists in coderd
    # checks: R-KEY-13, R-KEY-14, R-KEY-15, R-KEY-17
    And coderd saw exactly 2 POST on "provisionerkeys"
    # checks: R-KEY-13, R-KEY-14, R-KEY-15, R-KEY-17
    And coderd saw exactly 1 DELETE on "provisionerkey"
    # checks: R-KEY-13, R-KEY-14, R-KEY-15
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "<key name>"
    # checks: R-POD-3
    And the provisioner pod template changes
    # checks: none
    And the provisioner becomes Ready

    Examples:
      | change              | spec                                     | key name                | organization          | tags hash |
      | a tag's value       | tags: {team: green}                      | coderprovisioner-sample | {organization}        | a05c8748  |
      | an added tag        | tags: {zone: a}                          | coderprovisioner-sample | {organization}        | 45100fb2  |
      | a removed tag       | tags: {team: null}                       | coderprovisioner-sample | {organization}        | cf1b2b92  |
      | the key name        | key: {name: renamed-key}                 | renamed-key             | {organization}        | 58d21dbb  |
      | the organization    | organizationName: "{second organization}" | coderprovisioner-sample | {second organization} | 58d21dbb  |

  @R-SEC-1 @R-SEC-6 @R-KEY-5 @R-POD-12 @core
  Scenario Outline: Moving the key to <where> writes it there and points the daemon at it
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    When the provisioner spec is changed to:
      """
      key: <key>
      """
    # checks: R-SEC-6
    Then the provisioner status has:
      | field          | value      |
      | secretRef.name | <secret>   |
      | secretRef.key  | <data key> |
    # checks: R-SEC-1, R-KEY-5
    And the key in Secret "<secret>" under "<data key>" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: R-POD-12
    And the provisioner container's env is:
      | name                         | value | secret              |
      | CODER_URL                    | {url} |                     |
      | CODER_PROVISIONER_DAEMON_KEY |       | <secret>/<data key> |
    # checks: none
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"
    # checks: none
    And the provisioner becomes Ready

    Examples:
      | where                 | key                                              | secret           | data key   |
      | another Secret        | {secretName: moved-key}                          | moved-key        | key        |
      | another data key      | {secretKey: daemon-key}                          | {provisioner}-provisioner-key | daemon-key |
      | both                  | {secretName: moved-key, secretKey: daemon-key}   | moved-key        | daemon-key |

  @R-KEY-11 @core
  Scenario: A lost key Secret whose key is gone from coderd too is only created again
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    Then the provisioner status records its provisioner key
    And the Secret "{provisioner}-provisioner-key" holds a provisioner key
    When the recorded provisioner key is deleted in coderd by someone else
    And the provisioner key Secret is deleted
    Then the Secret "{provisioner}-provisioner-key" gets a new provisioner key
    And coderd saw exactly 2 POST on "provisionerkeys"
    And coderd saw no DELETE on "provisionerkey"
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"

  @R-KEY-12 @extended
  Scenario: A usable key Secret without a recorded baseline is replaced once, then left alone
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    Then the Secret "{provisioner}-provisioner-key" holds a provisioner key
    When the provisioner's recorded key fields are removed from its status
    Then the Secret "{provisioner}-provisioner-key" gets a new provisioner key
    And the provisioner status records its provisioner key
    And coderd saw exactly 2 POST on "provisionerkeys"
    And coderd saw exactly 1 DELETE on "provisionerkey"
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"
    And coderd sees no provisioner key requests from now on during the observation window

  @R-KEY-16 @fault-injection @extended
  Scenario: A failed delete of the old key does not stop a rotation
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    Then the Secret "{provisioner}-provisioner-key" holds a provisioner key
    When coderd answers every DELETE on "provisionerkey" with status 500
    And the provisioner spec is changed to:
      """
      key: {name: renamed-key}
      """
    Then the Secret "{provisioner}-provisioner-key" gets a new provisioner key
    And coderd holds exactly 1 provisioner key named "renamed-key"
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "renamed-key"
    And the provisioner becomes Ready

  @R-KEY-24 @D-5 @extended
  Scenario: A rotation removes the recorded key, not another key that took its name
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    # checks: none
    Then the provisioner status records its provisioner key
    When the recorded provisioner key is replaced in coderd by someone else's key of the same name
    And the provisioner spec is changed to:
      """
      key: {name: renamed-key}
      """
    # checks: R-KEY-24
    Then coderd holds exactly 1 provisioner key named "renamed-key"
    # checks: R-KEY-24, D-5
    And coderd saw no DELETE on "provisionerkey"
    # checks: R-KEY-24, D-5
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"

  @R-KEY-21 @D-4 @extended
  Scenario: An upper-case key name ends with one lower-case key
    Given a Ready control plane with operator access
    # checks: R-KEY-21, D-4
    When the sample provisioner is applied with spec:
      """
      key:
        name: Upper-Case-Key
      """
    # checks: R-KEY-21
    Then the provisioner has condition "ProvisionerKeyReady" "True" with reason "ProvisionerKeyReady"
    # checks: R-KEY-21, D-4
    And coderd holds exactly 1 provisioner key named "upper-case-key"
    # checks: R-KEY-21
    And coderd saw exactly 1 POST on "provisionerkeys"

  # coderd treats only the exact path value "default" as the default organization; any other
  # spelling is a case-insensitive name lookup, and no organization is named "default" (its name is
  # coder since coderd v2.16, first-organization before). coderd's 404 body for an unknown
  # organization is one JSON object (two in coderd before PR #13629; see the legacy-body scenario).
  # A provisioner already running in the default organization (its key named after the
  # scenario's own organization, unique to the scenario) must not make another spelling of
  # "default" name it.
  @R-KEY-19 @extended
  Scenario Outline: An organization unknown to coderd creates no key
    Given a Ready control plane with operator access
    And the sample provisioner is applied with spec:
      """
      organizationName: default
      key: {name: "{organization}"}
      """
    # checks: none
    Then the provisioner becomes Ready
    When a second provisioner "elsewhere" is applied with spec:
      """
      organizationName: <organization>
      """
    Then the provisioner "elsewhere" has condition "ProvisionerKeyReady" "False" with reason "ProvisionerKeyFailed"
    And coderd saw exactly 1 POST on "provisionerkeys"

    Examples:
      | organization         |
      | no-such-organization |
      | Default              |
      | DEFAULT              |

  # Before coderd PR #13629 the organization 404 held two JSON objects in one body; an operator
  # decodes the first JSON value of an error body and decides on the status code (coderd-api.md §2.3).
  @R-KEY-19 @fault-injection @extended
  Scenario: An unknown organization's legacy two-object 404 body creates no key either
    Given a Ready control plane with operator access
    And coderd answers an unknown organization with its legacy two-object body
    When the sample provisioner is applied with spec:
      """
      organizationName: no-such-organization
      """
    Then the provisioner has condition "ProvisionerKeyReady" "False" with reason "ProvisionerKeyFailed"
    And coderd saw no POST on "provisionerkeys"

  # A 401 or 403 on a key request is a key failure too: the operator's access was checked
  # (entitlements and the organization answered), so it is not blamed.
  @R-KEY-18 @R-PRE-11 @fault-injection @extended
  Scenario Outline: A key request answered <status> is reported and changes nothing else
    Given a Ready control plane with operator access
    And coderd answers every POST on "provisionerkeys" with status <status>
    When the sample provisioner is applied
    # checks: R-KEY-18
    Then the provisioner has condition "ProvisionerKeyReady" "False" with reason "ProvisionerKeyFailed"
    # checks: R-KEY-18, R-PRE-11
    And the provisioner has condition "OperatorAccessReady" "True" with reason "OperatorAccessReady"
    # checks: R-KEY-18
    And no child object of the provisioner exists during the observation window

    Examples:
      | status |
      | 500    |
      | 401    |
      | 403    |

  # The request that learns the new key's id (D-12: with the key itself, authenticated by the key,
  # or by listing the organization's keys) comes after the operator's access was checked: coderd's
  # 401 there refuses a key request, not the operator's access. An operator may report the failure
  # and retry, or learn the id the other way (D-12); either way it never blames its access.
  @R-KEY-18 @R-PRE-11 @fault-injection @extended
  Scenario Outline: A refused <id request> of a new key is not taken for an operator access failure
    Given a Ready control plane with operator access
    And coderd answers the next GET on "<route>" after a key create with status 401
    When the sample provisioner is applied
    # checks: none
    Then the operator learns its new key's id <way>, or this scenario does not apply (D-12)
    # checks: none
    And the provisioner becomes Ready
    # checks: R-KEY-18
    And the provisioner never showed condition "ProvisionerKeyReady" "False" with a reason other than "ProvisionerKeyFailed"
    # checks: R-PRE-11
    And the provisioner never showed condition "OperatorAccessReady" "False"

    Examples:
      | id request | route           | way                                |
      | lookup     | daemon-key      | with the key itself                |
      | listing    | provisionerkeys | by listing the organization's keys |

  @R-KEY-22 @D-5 @extended
  Scenario: A same-named key the provisioner has no plaintext for is replaced
    Given a Ready control plane with operator access
    And a provisioner key named "coderprovisioner-sample" already exists in the scenario's organization
    When the sample provisioner is applied
    # checks: R-KEY-22
    Then the provisioner becomes Ready
    # checks: R-KEY-22
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"
    # checks: R-KEY-22
    And coderd saw exactly 1 DELETE on "provisionerkey"
    # checks: R-KEY-22
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: D-5
    And a Warning Event "ReplacedUnrecordedKey" is recorded for the provisioner

  # Events before effects: the Warning names the key before it is deleted, so an operator that
  # stops between the two still leaves a trace of the replacement.
  @D-5 @fault-injection @extended
  Scenario: The replacement of a same-named key is announced before the key is deleted
    Given a Ready control plane with operator access
    And a provisioner key named "coderprovisioner-sample" already exists in the scenario's organization
    When coderd delays its answers to every DELETE on "provisionerkey" by 4 seconds
    And the sample provisioner is applied
    Then while coderd holds back the DELETE answer a Warning Event "ReplacedUnrecordedKey" is recorded for the provisioner
    And the provisioner becomes Ready
