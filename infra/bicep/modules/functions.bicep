// The Function App (Python 3.11, Linux, Flex Consumption): the API and portal, the planner
// and completion queue triggers, the monitor orchestration. host.json tunes the triggers.

param prefix string
param suffix string
param location string
param storageName string
param blobEndpoint string
@description('The app settings the code reads (names.json keys → values), shared with the workers.')
param settings object
@description('Most Function App instances at once.')
param maxInstances int
@description('The Entra ID app registration (client id) users sign in through; empty: personal API tokens only.')
param entraClientId string
@description('The Entra ID issuer, https://login.microsoftonline.com/<tenant>/v2.0.')
param entraIssuer string
@secure()
@description('The app registration\'s client secret (App Service Authentication redeems sign-in codes with it).')
param entraClientSecret string

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: '${prefix}-plan-${suffix}'
  location: location
  kind: 'functionapp'
  sku: { tier: 'FlexConsumption', name: 'FC1' }
  properties: { reserved: true }
}

var signIn = !empty(entraClientId)
var secretSetting = 'MICROSOFT_PROVIDER_AUTHENTICATION_SECRET' // the name App Service Authentication reads
var hostSettings = concat([
  // the Functions host's own storage (Durable task hub, triggers' bookkeeping), by identity
  { name: 'AzureWebJobsStorage__accountName', value: storageName }
], signIn ? [ { name: secretSetting, value: entraClientSecret } ] : [])

resource app 'Microsoft.Web/sites@2024-04-01' = {
  name: '${prefix}-fn-${suffix}'
  location: location
  kind: 'functionapp,linux'
  identity: { type: 'SystemAssigned' }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${blobEndpoint}app-package'
          authentication: { type: 'SystemAssignedIdentity' }
        }
      }
      scaleAndConcurrency: { maximumInstanceCount: maxInstances, instanceMemoryMB: 2048 }
      runtime: { name: 'python', version: '3.11' }
    }
    siteConfig: {
      appSettings: concat(hostSettings, map(items(settings), s => { name: s.key, value: s.value }))
    }
  }
}

// App Service Authentication (Easy Auth) with Microsoft Entra ID in front of the app. It signs
// browsers in (/.auth/login/aad) and forwards each signed-in request's ID token
// (X-MS-TOKEN-AAD-ID-TOKEN: the token store must be on), which the app verifies itself
// (pipeline/web/entra.py). Unauthenticated requests go through to the app (AllowAnonymous): scripts
// come with personal API tokens, and the app refuses whatever is signed in neither way.
resource auth 'Microsoft.Web/sites/config@2024-04-01' = if (signIn) {
  parent: app
  name: 'authsettingsV2'
  properties: {
    platform: { enabled: true }
    globalValidation: {
      requireAuthentication: false
      unauthenticatedClientAction: 'AllowAnonymous'
    }
    httpSettings: { requireHttps: true }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          openIdIssuer: entraIssuer
          clientId: entraClientId
          clientSecretSettingName: secretSetting
        }
        login: { loginParameters: [ 'scope=openid profile email offline_access' ] }
        validation: { allowedAudiences: [ entraClientId, 'api://${entraClientId}' ] }
      }
    }
    login: {
      tokenStore: { enabled: true }
      allowedExternalRedirectUrls: []
    }
  }
}

output principalId string = app.identity.principalId
output name string = app.name
output hostName string = app.properties.defaultHostName
