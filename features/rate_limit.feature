@fake-coderd @fault-injection @rate-limit
Feature: Rate limiting by coderd
  coderd answers 429 when a client sends too many requests. The operator reports it, backs off
  (about 2 s, then 4 s, doubling each time) and retries, and marks its key requests with the
  owner's bypass header. A success starts the backoff over.

  @R-RL-1 @R-RL-4 @slow @extended
  Scenario: A rate-limited key request is reported and retried later
    Given a Ready control plane with operator access
    And coderd answers every POST on "provisionerkeys" with status 429
    When the sample provisioner is applied
    # checks: R-RL-1
    Then the provisioner has condition "ProvisionerKeyReady" "False" with reason "RateLimited"
    # checks: R-RL-1
    And the ProvisionerKeyReady condition's message is "Coder API rate limited while reconciling provisioner key"
    # checks: R-RL-4
    And no child object of the provisioner exists during the observation window
    When coderd answers normally again
    # checks: R-RL-1
    Then the provisioner becomes Ready
    # checks: R-RL-4
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"

  # Deleting the old key after a rotation is best effort (R-KEY-16), but a 429 is not a failure
  # to shrug off: it stops the pass like any rate-limited key request, and the delete is retried.
  @R-RL-1 @R-KEY-16 @D-9 @extended
  Scenario: A rate-limited delete of the old key stops the pass and is retried
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    When coderd answers every DELETE on "provisionerkey" with status 429
    And the provisioner spec is changed to:
      """
      key: {name: renamed-key}
      """
    # checks: R-RL-1, D-9
    Then the provisioner has condition "ProvisionerKeyReady" "False" with reason "RateLimited"
    When coderd answers normally again
    # checks: none
    Then the provisioner becomes Ready
    # checks: R-RL-1, D-9
    And coderd holds exactly 0 provisioner key named "coderprovisioner-sample"
    # checks: R-KEY-16
    And coderd holds exactly 1 provisioner key named "renamed-key"

  # After a create the operator learns the new key's id, with the key itself or by listing the
  # organization's keys (D-12): each row tests an operator that uses its route. A 429 on that
  # request says nothing against the key: it is stored and recorded, and only the id request is
  # retried; deleting it and creating another would meet the same 429 again (key churn).
  @R-RL-1 @R-KEY-4 @extended
  Scenario Outline: A rate-limited <id request> of a new key keeps the key
    Given a Ready control plane with operator access
    And coderd answers the next GET on "<route>" after a key create with status 429
    When the sample provisioner is applied
    # checks: none
    Then the operator learns its new key's id <way>, or this scenario does not apply (D-12)
    # checks: R-RL-1
    And the provisioner becomes Ready
    # checks: R-KEY-4
    And coderd saw exactly 1 POST on "provisionerkeys"
    # checks: R-KEY-4
    And coderd saw no DELETE on "provisionerkey"
    # checks: none
    And the provisioner status records the key in Secret "{provisioner}-provisioner-key"

    Examples:
      | id request | route           | way                                |
      | lookup     | daemon-key      | with the key itself                |
      | listing    | provisionerkeys | by listing the organization's keys |

  # The kept key's id is then learned on a later pass, the same way. Only a 401 there (R-KEY-18's
  # failures are reported and retried) says the key is no key any more.
  @R-KEY-18 @R-KEY-4 @extended
  Scenario Outline: A kept key whose next <id request> is answered <status> is still kept
    Given a Ready control plane with operator access
    And coderd answers the next GET on "<route>" after a key create with status 429
    And coderd answers the next GET on "<route>" after a key create with status <status>
    When the sample provisioner is applied
    # checks: none
    Then the operator learns its new key's id <way>, or this scenario does not apply (D-12)
    # checks: R-KEY-18
    And the provisioner becomes Ready
    # checks: R-KEY-4
    And coderd saw exactly 1 POST on "provisionerkeys"
    # checks: R-KEY-4
    And coderd saw no DELETE on "provisionerkey"

    Examples:
      | id request | route           | way                                | status |
      | lookup     | daemon-key      | with the key itself                | 429    |
      | lookup     | daemon-key      | with the key itself                | 403    |
      | lookup     | daemon-key      | with the key itself                | 500    |
      | listing    | provisionerkeys | by listing the organization's keys | 429    |
      | listing    | provisionerkeys | by listing the organization's keys | 403    |
      | listing    | provisionerkeys | by listing the organization's keys | 500    |

  # A rotation's new key's id is learned the same way; until it is known the status must not
  # keep the old key's (deleted) id, or the new key is never looked up nor cleaned up.
  @R-RL-1 @R-KEY-6 @R-KEY-24 @extended
  Scenario Outline: A rate-limited <id request> of a rotated key records the new key
    Given a Ready control plane with operator access
    And the sample provisioner is Ready
    When coderd answers the next GET on "<route>" after a key create with status 429
    And the provisioner spec is changed to:
      """
      tags: {team: green}
      """
    # checks: none
    Then the operator learns its new key's id <way>, or this scenario does not apply (D-12)
    # checks: R-KEY-6
    And the provisioner status has:
      | field    | value    |
      | tagsHash | a05c8748 |
    # checks: R-KEY-6
    And the key in Secret "{provisioner}-provisioner-key" authenticates to coderd as the key named "coderprovisioner-sample"
    # checks: R-KEY-24
    And coderd holds exactly 1 provisioner key named "coderprovisioner-sample"
    # checks: R-RL-1
    And the provisioner becomes Ready

    Examples:
      | id request | route           | way                                |
      | lookup     | daemon-key      | with the key itself                |
      | listing    | provisionerkeys | by listing the organization's keys |

  @R-RL-2 @slow @serial @extended
  Scenario: Rate-limited key requests are retried with a doubling backoff
    Given a Ready control plane with operator access
    And coderd answers every POST on "provisionerkeys" with status 429
    When the sample provisioner is applied
    Then coderd sees 5 POST on "provisionerkeys" spaced by a backoff doubling from 2 seconds

  # A 429 on the request that learns the new key's id stops the pass like any other (R-RL-4): the
  # kept key's id is asked again after the backoff, and no Deployment runs a key whose record is
  # unknown. (Only the answers 429 count: an operator may list before its create too.)
  @R-RL-2 @R-RL-4 @slow @serial @extended
  Scenario Outline: Rate-limited <id request>s of a new key are retried with a doubling backoff
    Given a Ready control plane with operator access
    And coderd answers every GET on "<route>" after a key create with status 429
    When the sample provisioner is applied
    # checks: none
    Then the operator learns its new key's id <way>, or this scenario does not apply (D-12)
    # checks: R-RL-2
    And coderd sees 3 GET on "<route>" answered 429 spaced by a backoff doubling from 2 seconds
    # checks: R-RL-4
    And no Deployment named "provisioner-{provisioner}" exists during the observation window

    Examples:
      | id request | route           | way                                |
      | lookup     | daemon-key      | with the key itself                |
      | listing    | provisionerkeys | by listing the organization's keys |

  @R-RL-3 @slow @serial @extended
  Scenario: A success starts the backoff over
    Given a Ready control plane with operator access
    And coderd answers every POST on "provisionerkeys" with status 429
    When the sample provisioner is applied
    Then coderd sees 3 POST on "provisionerkeys" spaced by a backoff doubling from 2 seconds
    When coderd answers normally again
    Then the provisioner becomes Ready
    When coderd answers every POST on "provisionerkeys" with status 429
    And the provisioner key Secret is deleted
    Then coderd sees 2 POST on "provisionerkeys" since the last action spaced by a backoff doubling from 2 seconds

  # A 500 fails the pass for another reason than 429, so the next 429 waits the first backoff
  # again. The 500 is answered once, ahead of the 429s that follow it.
  @R-RL-2 @R-RL-3 @slow @serial @extended
  Scenario: A failure other than 429 starts the backoff over
    Given a Ready control plane with operator access
    And coderd answers every POST on "provisionerkeys" with status 429
    When the sample provisioner is applied
    # checks: R-RL-2
    Then coderd sees 3 POST on "provisionerkeys" spaced by a backoff doubling from 2 seconds
    When coderd answers normally again
    And coderd answers the next POST on "provisionerkeys" with status 500
    And coderd answers every POST on "provisionerkeys" with status 429
    # checks: R-RL-3
    Then coderd sees 2 POST on "provisionerkeys" answered 429 since the last action spaced by a backoff doubling from 2 seconds

  @R-KEY-23 @R-RL-5 @extended
  Scenario: Key and entitlement requests carry the rate-limit bypass header
    Given a Ready control plane with operator access
    And the control plane's entitlement check is older than two minutes
    When the sample provisioner is applied
    # checks: none
    Then the provisioner becomes Ready
    # checks: R-KEY-23, R-RL-5
    And every POST on "provisionerkeys" carried the rate-limit bypass header
    # checks: R-KEY-23, R-RL-5
    And every GET on "entitlements" carried the rate-limit bypass header
    When the provisioner spec is changed to:
      """
      tags: {scope: organization, team: red}
      """
    # checks: none
    Then coderd saw exactly 1 DELETE on "provisionerkey"
    # checks: R-KEY-23, R-RL-5
    And every DELETE on "provisionerkey" carried the rate-limit bypass header

  # Only an owner may bypass the rate limit: coderd answers 428 to anyone else who asks, and the
  # operator repeats the same request once without the header.
  @R-KEY-23 @R-RL-5 @coderd-428 @extended
  Scenario: A token that may not bypass the rate limit repeats its requests without the header
    Given a Ready control plane with operator access
    And the operator's token is a template admin's, not an owner's
    And the control plane's entitlement check is older than two minutes
    When the sample provisioner is applied
    # checks: R-KEY-23, R-RL-5
    Then the provisioner becomes Ready
    # checks: R-KEY-23, R-RL-5
    And every POST on "provisionerkeys" answered 428 was repeated once without the rate-limit bypass header
    # checks: R-KEY-23, R-RL-5
    And every GET on "entitlements" answered 428 was repeated once without the rate-limit bypass header
